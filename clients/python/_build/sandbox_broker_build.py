"""A PEP 517 build backend for this package, in the standard library only.

It lets ``pip install ./clients/python`` work offline: the package needs
nothing beyond the standard library, so building it should not need
setuptools or wheel downloaded from an index either. It builds a pure-Python
wheel of the ``sandbox_broker`` package and an sdist of the project; the
metadata comes from ``pyproject.toml``'s ``[project]`` table (read with
``tomllib`` on Python 3.11+, or the few plain ``key = "value"`` lines this
file uses on 3.10).
"""

from __future__ import annotations

import base64
import hashlib
import io
import os
import re
import tarfile
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = "sandbox_broker"


def _project() -> dict[str, str]:
    text = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    try:
        import tomllib
    except ImportError:  # Python 3.10
        section = text.split("[project]", 1)[1].split("\n[", 1)[0]
        return dict(re.findall(r'^(\w[\w-]*)\s*=\s*"([^"]*)"', section, re.M))
    return {k: v for k, v in tomllib.loads(text)["project"].items() if isinstance(v, str)}


def _metadata() -> tuple[str, str, bytes]:
    p = _project()
    name, version = p["name"], p["version"]
    lines = ["Metadata-Version: 2.1", f"Name: {name}", f"Version: {version}"]
    if p.get("description"):
        lines.append(f"Summary: {p['description']}")
    if p.get("requires-python"):
        lines.append(f"Requires-Python: {p['requires-python']}")
    return name, version, ("\n".join(lines) + "\n").encode("utf-8")


def _dist_name(name: str) -> str:
    return re.sub(r"[-_.]+", "_", name).lower()


def _package_files() -> list[Path]:
    return sorted(p for p in (ROOT / PACKAGE).rglob("*.py") if "__pycache__" not in p.parts)


def _record_line(arcname: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{arcname},sha256={digest},{len(data)}"


def get_requires_for_build_wheel(config_settings=None):  # noqa: ANN001, ANN201 - PEP 517 signature
    return []


def get_requires_for_build_sdist(config_settings=None):  # noqa: ANN001, ANN201
    return []


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):  # noqa: ANN001, ANN201
    name, version, metadata = _metadata()
    dist = _dist_name(name)
    info = f"{dist}-{version}.dist-info"
    filename = f"{dist}-{version}-py3-none-any.whl"
    entries: list[tuple[str, bytes]] = []
    for path in _package_files():
        entries.append((path.relative_to(ROOT).as_posix(), path.read_bytes()))
    entries.append((f"{info}/METADATA", metadata))
    entries.append((f"{info}/WHEEL", b"Wheel-Version: 1.0\nGenerator: sandbox_broker_build\nRoot-Is-Purelib: true\nTag: py3-none-any\n"))
    entries.append((f"{info}/top_level.txt", f"{PACKAGE}\n".encode()))
    record = [_record_line(arc, data) for arc, data in entries] + [f"{info}/RECORD,,"]
    entries.append((f"{info}/RECORD", ("\n".join(record) + "\n").encode()))
    with zipfile.ZipFile(os.path.join(wheel_directory, filename), "w", zipfile.ZIP_DEFLATED) as zf:
        for arc, data in entries:
            zi = zipfile.ZipInfo(arc, date_time=(2020, 1, 1, 0, 0, 0))
            zi.external_attr = 0o644 << 16
            zi.compress_type = zipfile.ZIP_DEFLATED
            zf.writestr(zi, data)
    return filename


def build_sdist(sdist_directory, config_settings=None):  # noqa: ANN001, ANN201
    name, version, metadata = _metadata()
    base = f"{_dist_name(name)}-{version}"
    filename = f"{base}.tar.gz"
    files = _package_files() + [ROOT / "pyproject.toml", ROOT / "README.md", Path(__file__)]
    files += sorted(p for p in (ROOT / "tests").glob("*.py"))
    with tarfile.open(os.path.join(sdist_directory, filename), "w:gz") as tf:
        for path in files:
            tf.add(path, arcname=f"{base}/{path.relative_to(ROOT).as_posix()}")
        ti = tarfile.TarInfo(f"{base}/PKG-INFO")
        ti.size = len(metadata)
        tf.addfile(ti, io.BytesIO(metadata))
    return filename
