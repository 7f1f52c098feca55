"""Work inside an acquired sandbox: commands, files, listing and search.

One :class:`Sandbox` speaks to either connection kind the broker hands out
(envd for backend ``e2b``, the AIO sandbox API for backend ``provisioner``);
the operations behave the same on both. Paths under ``/mnt/user-data`` (the
agent's view of its thread data) map to the sandbox home, ``/home/user``;
other absolute paths are used as given; relative paths are taken from the
home. A path with a ``..`` segment is refused with ``PermissionError``.
"""

from __future__ import annotations

import errno
import fnmatch
import re
import threading
from dataclasses import dataclass
from typing import Any, Mapping

from ._transport import AIOTransport, EnvdTransport, SandboxUnreachable, Transport

__all__ = [
    "DEFAULT_COMMAND_TIMEOUT",
    "GrepMatch",
    "IGNORED_NAMES",
    "MAX_DOWNLOAD_SIZE",
    "Sandbox",
    "SandboxUnreachable",
    "VIRTUAL_PREFIX",
]

VIRTUAL_PREFIX = "/mnt/user-data"
DEFAULT_HOME = "/home/user"
# download_file refuses larger files (OSError EFBIG) before reading them whole.
MAX_DOWNLOAD_SIZE = 100 * 1024 * 1024
# A command's limit when execute_command is given no timeout, seconds.
DEFAULT_COMMAND_TIMEOUT = 600.0
# Directory names glob and grep never descend into (version control,
# dependency and cache trees).
IGNORED_NAMES = (".git", ".hg", ".svn", "node_modules", "__pycache__", ".venv", ".mypy_cache", ".pytest_cache", ".ruff_cache")
# list_dir answers at most this many entries.
_LIST_LIMIT = 500
# glob reads at most this many candidate paths from the sandbox.
_GLOB_SCAN_LIMIT = 20000
# grep lines are cut to this many characters.
_GREP_LINE_MAX = 200

_ENV_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


@dataclass(frozen=True)
class GrepMatch:
    """One matching line: the file's sandbox path, its 1-based line number
    and the line (cut to 200 characters)."""

    path: str
    line_number: int
    line: str


def validate_env(env: Mapping[str, str] | None) -> None:
    """Raise ValueError unless every key is a POSIX variable name."""
    for key in env or {}:
        if not isinstance(key, str) or not _ENV_KEY.fullmatch(key):
            raise ValueError(f"env key {key!r} must match {_ENV_KEY.pattern}")


def glob_match(pattern: str, rel_path: str) -> bool:
    """Whether ``rel_path`` (relative to the search root) matches ``pattern``.

    A pattern without ``/`` matches the file name at any depth (``*.py``).
    A pattern with ``/`` is anchored at the root, segment by segment, where
    ``**`` spans any number of directories (``src/*.js`` matches
    ``src/app.js`` but neither ``lib/x.js`` nor ``a/src/app.js``;
    ``src/**/*.js`` matches at any depth under ``src``).
    """
    pattern = pattern.strip()
    while pattern.startswith("./"):
        pattern = pattern[2:]
    parts = [p for p in rel_path.split("/") if p]
    if not parts:
        return False
    if "/" not in pattern:
        return pattern == "**" or fnmatch.fnmatchcase(parts[-1], pattern)
    return _match_segments([p for p in pattern.strip("/").split("/") if p], parts)


def _match_segments(pat: list[str], parts: list[str]) -> bool:
    if not pat:
        return not parts
    if pat[0] == "**":
        return any(_match_segments(pat[1:], parts[i:]) for i in range(len(parts) + 1))
    return bool(parts) and fnmatch.fnmatchcase(parts[0], pat[0]) and _match_segments(pat[1:], parts[1:])


def connection_kind(connection: Mapping[str, str]) -> str:
    """The protocol of an acquire reply's connection: its ``protocol``
    ("envd" or "aio"), else inferred from its URL field; "" when neither
    says."""
    protocol = connection.get("protocol") or ""
    if protocol:
        return protocol
    if connection.get("sandbox_url"):
        return "aio"
    if connection.get("envd_url"):
        return "envd"
    return ""


def _ignored(rel_path: str) -> bool:
    return any(seg in IGNORED_NAMES for seg in rel_path.split("/"))


def _cut(line: str) -> str:
    line = line.rstrip("\r\n")
    return line if len(line) <= _GREP_LINE_MAX else line[: _GREP_LINE_MAX - 3] + "..."


def _prune_expr() -> str:
    names = " -o ".join(f"-name {n}" for n in IGNORED_NAMES)
    return f"\\( {names} \\) -prune"


class Sandbox:
    """A sandbox the broker handed out, reached with its connection only.

    ``connection`` is the acquire reply's ``connection`` (or pass a
    :class:`sandbox_broker.Lease` to :meth:`from_lease`). Thread-safe.
    Commands and reads report a sandbox that stopped running by marking it
    dead (:attr:`is_dead`); acquire again to get a working one.
    """

    def __init__(
        self,
        sandbox_id: str,
        connection: Mapping[str, str],
        *,
        home_dir: str = DEFAULT_HOME,
        command_timeout: float = DEFAULT_COMMAND_TIMEOUT,
    ) -> None:
        if not sandbox_id:
            raise ValueError("sandbox_id must not be empty")
        self._id = sandbox_id
        self._home = home_dir.rstrip("/") or "/"
        self.command_timeout = float(command_timeout)
        self._dead = False
        self._lock = threading.Lock()
        self.kind = connection_kind(connection)
        if self.kind == "aio":
            self._t: Transport = AIOTransport(connection["sandbox_url"], connection.get("access_token", ""), self._home)
        elif self.kind == "envd":
            self._t = EnvdTransport(sandbox_id, connection["envd_url"], connection.get("envd_access_token", ""))
        else:
            raise ValueError(f"connection protocol {connection.get('protocol')!r}: this client speaks envd and aio")

    @classmethod
    def from_lease(cls, lease: Any, **kwargs: Any) -> "Sandbox":
        """The sandbox of an acquire reply (:class:`sandbox_broker.Lease`)."""
        return cls(lease.sandbox_id, lease.connection, **kwargs)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self._id!r}, kind={self.kind!r})"

    @property
    def id(self) -> str:
        return self._id

    @property
    def sandbox_id(self) -> str:
        return self._id

    @property
    def home_dir(self) -> str:
        return self._home

    @property
    def is_dead(self) -> bool:
        """True once a call found the sandbox no longer running."""
        with self._lock:
            return self._dead

    def _mark_dead(self) -> None:
        with self._lock:
            self._dead = True

    def resolve_path(self, path: str) -> str:
        """The sandbox path for ``path`` (see the module doc)."""
        if not isinstance(path, str) or not path:
            raise ValueError("path must be a non-empty string")
        p = path.replace("\\", "/")
        if ".." in p.split("/"):
            raise PermissionError(f"access denied: path traversal in {path!r}")
        if p == VIRTUAL_PREFIX or p.startswith(VIRTUAL_PREFIX + "/"):
            p = self._home + "/" + p[len(VIRTUAL_PREFIX) :]
        elif not p.startswith("/"):
            p = self._home + "/" + p
        p = re.sub(r"/+", "/", p)
        p = "/".join(seg for seg in p.split("/") if seg != ".")
        return p.rstrip("/") or "/"

    def _run(self, command: str, env: dict[str, str] | None, timeout: float | None) -> Any:
        try:
            return self._t.run(command, env, float(timeout) if timeout else self.command_timeout)
        except SandboxUnreachable:
            self._mark_dead()
            raise

    # ── commands ─────────────────────────────────────────────────────────

    def execute_command(self, command: str, env: dict[str, str] | None = None, timeout: float | None = None) -> str:
        """Run ``command`` with ``bash -l -c`` in the sandbox home and return
        its output (stdout, then stderr). ``env`` is this command's extra
        environment: keys must match ``^[A-Za-z_][A-Za-z0-9_]*$`` (else
        ValueError, before anything is sent) and values travel as the
        process environment, never inside the command. ``timeout`` in
        seconds (default :data:`DEFAULT_COMMAND_TIMEOUT`) kills the command.

        Failures come back as text starting with ``Error:`` (the caller is
        an agent tool); a non-zero exit without output reads
        ``Command exited with code N``, no output at all ``(no output)``.
        """
        validate_env(env)
        if self.is_dead:
            return f"Error: sandbox {self._id} is no longer running; acquire a sandbox again"
        try:
            res = self._run(command, env, timeout)
        except Exception as err:  # noqa: BLE001 - reported to the agent as text
            return f"Error: {err}"
        out = res.stdout
        if res.stderr:
            out = f"{out}\n{res.stderr}" if out and not out.endswith("\n") else out + res.stderr
        if not out and res.exit_code != 0:
            return f"Command exited with code {res.exit_code}"
        return out or "(no output)"

    # ── files ────────────────────────────────────────────────────────────

    def _read_bytes(self, resolved: str, limit: int | None = None) -> bytes:
        try:
            dl = self._t.open_read(resolved)
        except SandboxUnreachable:
            self._mark_dead()
            raise
        with dl:
            if limit is not None and dl.size is not None and dl.size > limit:
                raise OSError(errno.EFBIG, f"file is larger than the {limit}-byte download limit", resolved)
            chunks, total = [], 0
            for chunk in dl:
                total += len(chunk)
                if limit is not None and total > limit:
                    raise OSError(errno.EFBIG, f"file is larger than the {limit}-byte download limit", resolved)
                chunks.append(chunk)
        return b"".join(chunks)

    def read_file(self, path: str, start_line: int | None = None, end_line: int | None = None) -> str:
        """The file's text (UTF-8, undecodable bytes replaced), or lines
        ``start_line`` to ``end_line`` (1-indexed, inclusive; either may be
        omitted). A failure comes back as text starting with ``Error:``."""
        try:
            resolved = self.resolve_path(path)
            text = self._read_bytes(resolved).decode("utf-8", "replace")
        except Exception as err:  # noqa: BLE001 - reported to the agent as text
            return f"Error: {err}"
        if start_line is None and end_line is None:
            return text
        lines = text.splitlines()
        first = max(1, start_line or 1)
        last = len(lines) if end_line is None else end_line
        return "\n".join(lines[first - 1 : last])

    def write_file(self, path: str, content: str, append: bool = False) -> None:
        """Write ``content`` (UTF-8) to the file, creating parent directories;
        with ``append`` the content is added after the file's current text
        (a missing file counts as empty)."""
        resolved = self.resolve_path(path)
        data = content.encode("utf-8")
        if append:
            try:
                data = self._read_bytes(resolved) + data
            except FileNotFoundError:
                pass
        self._write(resolved, data)

    def update_file(self, path: str, content: bytes) -> None:
        """Replace the file's bytes with ``content``, creating parent
        directories."""
        self._write(self.resolve_path(path), bytes(content))

    def _write(self, resolved: str, data: bytes) -> None:
        try:
            self._t.write(resolved, data)
        except SandboxUnreachable:
            self._mark_dead()
            raise

    def download_file(self, path: str) -> bytes:
        """The file's bytes, streamed. Only paths under ``/mnt/user-data``
        are allowed (else PermissionError, as for any ``..`` segment); a
        file over :data:`MAX_DOWNLOAD_SIZE` raises ``OSError(EFBIG)`` before
        it is read whole; a missing file FileNotFoundError; other failures
        OSError."""
        p = path.replace("\\", "/") if isinstance(path, str) else ""
        if ".." in p.split("/"):
            raise PermissionError(f"access denied: path traversal in {path!r}")
        if p != VIRTUAL_PREFIX and not p.startswith(VIRTUAL_PREFIX + "/"):
            raise PermissionError(f"access denied: {path!r} is not under {VIRTUAL_PREFIX}")
        try:
            return self._read_bytes(self.resolve_path(p), MAX_DOWNLOAD_SIZE)
        except OSError:
            raise
        except Exception as err:  # noqa: BLE001 - one exception type for callers
            raise OSError(f"download {path}: {err}") from err

    # ── listing and search ───────────────────────────────────────────────

    def _paths(self, script: str, env: dict[str, str]) -> list[str]:
        res = self._run(script, env, 120.0)
        return [p for p in res.stdout.split("\0") if p]

    def list_dir(self, path: str, max_depth: int = 2) -> list[str]:
        """Files and directories under ``path``, up to ``max_depth`` levels
        down, as sandbox paths (at most 500; the directory itself is not
        listed). An unreadable or missing directory lists as empty."""
        root = self.resolve_path(path)
        script = 'find "$SBX_ROOT" -mindepth 1 -maxdepth "$SBX_DEPTH" \\( -type f -o -type d \\) -print0 2>/dev/null | head -z -n "$SBX_LIMIT"'
        try:
            return self._paths(script, {"SBX_ROOT": root, "SBX_DEPTH": str(max(1, int(max_depth))), "SBX_LIMIT": str(_LIST_LIMIT)})
        except (OSError, TimeoutError):
            return []

    def glob(self, path: str, pattern: str, *, include_dirs: bool = False, max_results: int = 200) -> tuple[list[str], bool]:
        """Sandbox paths under ``path`` matching ``pattern`` (see
        :func:`glob_match`), files only unless ``include_dirs``; returns
        ``(paths, truncated)``, ``truncated`` when more than ``max_results``
        matched (or the sandbox had too many entries to look at all).
        Directories named in :data:`IGNORED_NAMES` are skipped."""
        root = self.resolve_path(path)
        types = "\\( -type f -o -type d \\)" if include_dirs else "-type f"
        script = f'find "$SBX_ROOT" -mindepth 1 {_prune_expr()} -o {types} -print0 2>/dev/null | head -z -n "$SBX_LIMIT"'
        try:
            found = self._paths(script, {"SBX_ROOT": root, "SBX_LIMIT": str(_GLOB_SCAN_LIMIT)})
        except (OSError, TimeoutError):
            return [], False
        prefix = root.rstrip("/") + "/"
        matches: list[str] = []
        for entry in found:
            if not entry.startswith(prefix):
                continue
            rel = entry[len(prefix) :]
            if _ignored(rel) or not glob_match(pattern, rel):
                continue
            if len(matches) == max_results:
                return matches, True
            matches.append(entry)
        return matches, len(found) >= _GLOB_SCAN_LIMIT

    def grep(
        self,
        path: str,
        pattern: str,
        *,
        glob: str | None = None,
        literal: bool = False,
        case_sensitive: bool = False,
        max_results: int = 100,
    ) -> tuple[list[GrepMatch], bool]:
        """Lines matching ``pattern`` (an extended regular expression, or a
        fixed string with ``literal``; case-insensitive unless
        ``case_sensitive``) in the file ``path`` or the text files under it.
        ``glob`` limits the files searched (see :func:`glob_match`: a
        pattern with a directory part scopes the search to that directory
        under ``path``). Returns ``(matches, truncated)``. An invalid
        regular expression raises ``re.error`` before anything is sent."""
        if not literal:
            re.compile(pattern, 0 if case_sensitive else re.IGNORECASE)
        root = self.resolve_path(path)
        flags = ["-r", "-n", "-H", "-I", "-Z", "-F" if literal else "-E"]
        if not case_sensitive:
            flags.append("-i")
        env = {"SBX_ROOT": root, "SBX_PATTERN": pattern, "SBX_LIMIT": str(max_results * 4 + 50)}
        include = ""
        if glob:
            # grep's --include matches a file name at any depth: use the
            # pattern's last segment to narrow the search, then scope by
            # the whole pattern below.
            env["SBX_INCLUDE"] = glob.rstrip("/").rsplit("/", 1)[-1] or glob
            include = '--include="$SBX_INCLUDE"'
        excludes = " ".join(f"--exclude-dir={n}" for n in IGNORED_NAMES)
        script = (
            f'grep {" ".join(flags)} {include} {excludes} -m "$SBX_LIMIT" -e "$SBX_PATTERN" -- "$SBX_ROOT" 2>/dev/null'
            ' | head -n "$SBX_LIMIT"'
        )
        try:
            res = self._run(script, env, 120.0)
        except (OSError, TimeoutError):
            return [], False
        prefix = root.rstrip("/") + "/"
        matches: list[GrepMatch] = []
        for raw in res.stdout.split("\n"):
            file_path, sep, rest = raw.partition("\0")
            number, sep2, line = rest.partition(":")
            if not sep or not sep2 or not number.isdigit():
                continue
            if glob:
                rel = file_path.rsplit("/", 1)[-1] if file_path == root else file_path[len(prefix) :] if file_path.startswith(prefix) else None
                if rel is None or not glob_match(glob, rel):
                    continue
            if len(matches) == max_results:
                return matches, True
            matches.append(GrepMatch(file_path, int(number), _cut(line)))
        return matches, False
