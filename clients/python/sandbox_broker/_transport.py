"""The two ways into an acquired sandbox, behind one small interface.

- envd (backend ``e2b``): E2B's in-sandbox daemon. Commands go through the
  Connect protocol's JSON codec (``process.Process/Start``, a server stream
  of enveloped events), files through ``GET``/``POST /files``. Every request
  carries ``E2b-Sandbox-Id``, ``E2b-Sandbox-Port: 49983`` and, when the
  acquire reply gave one, ``X-Access-Token``.
- AIO (backend ``provisioner``): the AIO sandbox API (``POST /v1/bash/exec``,
  ``GET /v1/file/download``, ``POST /v1/file/upload``), with the access
  token, when given, as ``Authorization: Bearer``.
"""

from __future__ import annotations

import base64
import json
import math
import socket
import struct
import urllib.error
import urllib.parse
import urllib.request
import uuid
from dataclasses import dataclass
from typing import Any, BinaryIO, Iterator, Protocol

# E2B's SDKs send this port on every envd call.
_ENVD_PORT = "49983"
# Added to a command's timeout to bound the HTTP call that carries it.
_CALL_MARGIN = 30.0
# Cap on one Connect envelope and on error bodies read.
_MAX_ENVELOPE = 16 << 20
_MAX_ERROR_BODY = 64 << 10
# Timeout of file transfers and small control calls, seconds.
FILE_TIMEOUT = 600.0
_SIGNAL_TIMEOUT = 5.0


class SandboxUnreachable(ConnectionError):
    """The sandbox is not running (released and reaped, killed, or its
    daemon cannot be reached)."""


@dataclass
class ExecResult:
    stdout: str
    stderr: str
    exit_code: int


class Transport(Protocol):
    """What :class:`sandbox_broker.Sandbox` needs from a connection."""

    def run(self, command: str, env: dict[str, str] | None, timeout: float) -> ExecResult: ...

    def open_read(self, path: str) -> "Download": ...

    def write(self, path: str, data: bytes) -> None: ...


class Download:
    """A streamed file read: iterate for chunks; ``size`` is the announced
    length or None. Close it (or use ``with``) to free the connection."""

    def __init__(self, resp: Any, chunk: int = 1 << 16) -> None:
        self._resp = resp
        self._chunk = chunk
        length = resp.headers.get("Content-Length")
        self.size: int | None = int(length) if length and length.isdigit() else None

    def __iter__(self) -> Iterator[bytes]:
        while True:
            block = self._resp.read(self._chunk)
            if not block:
                return
            yield block

    def close(self) -> None:
        self._resp.close()

    def __enter__(self) -> "Download":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _json_message(raw: bytes) -> str:
    text = raw.decode("utf-8", "replace").strip()
    try:
        body = json.loads(text)
    except ValueError:
        return text
    if isinstance(body, dict):
        for key in ("message", "detail"):
            if isinstance(body.get(key), str) and body[key]:
                return body[key]
        if body.get("detail") is not None:
            return json.dumps(body["detail"])
    return text


def _http_failure(op: str, path: str, err: urllib.error.HTTPError) -> OSError:
    with err:
        msg = _json_message(err.read(_MAX_ERROR_BODY)) or f"HTTP {err.code}"
    if err.code == 404:
        return FileNotFoundError(2, f"{op}: {msg}", path)
    if err.code in (502, 503):
        return SandboxUnreachable(f"{op} {path}: sandbox not running (HTTP {err.code}): {msg}")
    return OSError(f"{op} {path}: HTTP {err.code}: {msg}")


def _open(req: urllib.request.Request, timeout: float, op: str, path: str) -> Any:
    try:
        return urllib.request.urlopen(req, timeout=timeout)
    except urllib.error.HTTPError as err:
        raise _http_failure(op, path, err) from None
    except urllib.error.URLError as err:
        raise SandboxUnreachable(f"{op} {path}: {err.reason}") from err


class EnvdTransport:
    """E2B envd, reached with the acquire reply's ``envd_url`` and
    ``envd_access_token``."""

    def __init__(self, sandbox_id: str, envd_url: str, access_token: str = "") -> None:
        self._id = sandbox_id
        self._base = envd_url.rstrip("/")
        self._token = access_token

    def _headers(self) -> dict[str, str]:
        h = {"E2b-Sandbox-Id": self._id, "E2b-Sandbox-Port": _ENVD_PORT}
        if self._token:
            h["X-Access-Token"] = self._token
        return h

    def run(self, command: str, env: dict[str, str] | None, timeout: float) -> ExecResult:
        msg: dict[str, Any] = {"process": {"cmd": "/bin/bash", "args": ["-l", "-c", command]}, "stdin": False}
        if env:
            msg["process"]["envs"] = dict(env)
        payload = json.dumps(msg).encode("utf-8")
        headers = self._headers()
        headers.update(
            {
                "Content-Type": "application/connect+json",
                "Connect-Protocol-Version": "1",
                "Connect-Timeout-Ms": str(max(1, int(timeout * 1000))),
                "Keepalive-Ping-Interval": "50",
            }
        )
        req = urllib.request.Request(
            self._base + "/process.Process/Start",
            data=struct.pack(">BI", 0, len(payload)) + payload,
            headers=headers,
            method="POST",
        )
        stdout, stderr = bytearray(), bytearray()
        pid = 0
        end: dict[str, Any] | None = None
        try:
            with _open(req, timeout + _CALL_MARGIN, "exec", "") as resp:
                while True:
                    flags, body = _read_envelope(resp)
                    if flags is None:
                        break
                    if flags & 0x02:  # end of stream: {} or {"error": {...}}
                        error = (body or {}).get("error")
                        if error:
                            raise _connect_error(error, timeout)
                        break
                    event = (body or {}).get("event") or {}
                    if "start" in event:
                        pid = int((event["start"] or {}).get("pid") or 0)
                    elif "data" in event:
                        data = event["data"] or {}
                        stdout += base64.b64decode(data.get("stdout") or data.get("pty") or "")
                        stderr += base64.b64decode(data.get("stderr") or "")
                    elif "end" in event:
                        end = event["end"] or {}
        except (socket.timeout, TimeoutError) as err:
            self._kill(pid)
            raise TimeoutError(f"command timed out after {timeout:g}s") from err
        except FileNotFoundError as err:
            raise SandboxUnreachable(f"sandbox not running: {err}") from err
        if end is None:
            raise SandboxUnreachable("process exited without a result (stream ended before its end event)")
        code = end.get("exitCode", end.get("exit_code", 0)) or 0
        return ExecResult(stdout.decode("utf-8", "replace"), stderr.decode("utf-8", "replace"), int(code))

    def _kill(self, pid: int) -> None:
        if not pid:
            return
        body = json.dumps({"process": {"pid": pid}, "signal": "SIGNAL_SIGKILL"}).encode("utf-8")
        headers = self._headers()
        headers.update({"Content-Type": "application/json", "Connect-Protocol-Version": "1"})
        req = urllib.request.Request(self._base + "/process.Process/SendSignal", data=body, headers=headers, method="POST")
        try:
            urllib.request.urlopen(req, timeout=_SIGNAL_TIMEOUT).close()
        except (OSError, urllib.error.URLError):
            pass  # best effort: the command's own deadline ends it too

    def open_read(self, path: str) -> Download:
        req = urllib.request.Request(self._base + "/files?" + urllib.parse.urlencode({"path": path}), headers=self._headers())
        return Download(_open(req, FILE_TIMEOUT, "read", path))

    def write(self, path: str, data: bytes) -> None:
        headers = self._headers()
        headers["Content-Type"] = "application/octet-stream"
        req = urllib.request.Request(
            self._base + "/files?" + urllib.parse.urlencode({"path": path}), data=data, headers=headers, method="POST"
        )
        _open(req, FILE_TIMEOUT, "write", path).close()


def _read_exact(resp: BinaryIO, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        block = resp.read(n - len(buf))
        if not block:
            break
        buf += block
    return bytes(buf)


def _read_envelope(resp: BinaryIO) -> tuple[int | None, dict[str, Any] | None]:
    head = _read_exact(resp, 5)
    if not head:
        return None, None
    if len(head) < 5:
        raise SandboxUnreachable("truncated Connect envelope")
    flags, size = struct.unpack(">BI", head)
    if size > _MAX_ENVELOPE:
        raise SandboxUnreachable(f"Connect envelope of {size} bytes exceeds {_MAX_ENVELOPE}")
    raw = _read_exact(resp, size)
    if len(raw) < size:
        raise SandboxUnreachable("truncated Connect envelope")
    try:
        body = json.loads(raw.decode("utf-8")) if raw else {}
    except ValueError as err:
        raise SandboxUnreachable(f"undecodable Connect envelope: {err}") from err
    return flags, body if isinstance(body, dict) else {}


def _connect_error(error: dict[str, Any], timeout: float) -> Exception:
    code, message = str(error.get("code") or "unknown"), str(error.get("message") or "")
    if code in ("deadline_exceeded", "canceled"):
        return TimeoutError(f"command timed out after {timeout:g}s: {message}")
    if code in ("unavailable", "not_found"):
        return SandboxUnreachable(f"sandbox not running: {code}: {message}")
    return OSError(f"exec failed: {code}: {message}")


class AIOTransport:
    """The AIO sandbox API, reached with the acquire reply's
    ``sandbox_url`` and optional ``access_token``."""

    def __init__(self, sandbox_url: str, access_token: str = "", home: str = "/home/user") -> None:
        self._base = sandbox_url.rstrip("/")
        self._token = access_token
        self._home = home

    def _headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self._token}"} if self._token else {}

    def _envelope(self, resp: Any, op: str) -> dict[str, Any]:
        try:
            body = json.loads(resp.read(_MAX_ENVELOPE).decode("utf-8"))
        except ValueError as err:
            raise OSError(f"{op}: undecodable reply: {err}") from err
        if not isinstance(body, dict):
            raise OSError(f"{op}: reply is not a JSON object")
        if body.get("success") is False:
            data = body.get("data") if isinstance(body.get("data"), dict) else {}
            msg = data.get("message") or body.get("message") or "failed"
            if data.get("error_type") == "not_found":
                raise FileNotFoundError(2, f"{op}: {msg}")
            raise OSError(f"{op}: {data.get('error_type') or 'error'}: {msg}")
        return body.get("data") if isinstance(body.get("data"), dict) else {}

    def run(self, command: str, env: dict[str, str] | None, timeout: float) -> ExecResult:
        secs = math.ceil(timeout)
        msg: dict[str, Any] = {
            "command": command,
            "exec_dir": self._home,
            "async_mode": False,
            "timeout": secs + 5,
            "hard_timeout": secs,
            "max_output_length": 0,
        }
        if env:
            msg["env"] = dict(env)
        headers = self._headers()
        headers["Content-Type"] = "application/json"
        req = urllib.request.Request(self._base + "/v1/bash/exec", data=json.dumps(msg).encode("utf-8"), headers=headers, method="POST")
        try:
            with _open(req, timeout + _CALL_MARGIN, "exec", "") as resp:
                data = self._envelope(resp, "exec")
        except FileNotFoundError as err:
            raise SandboxUnreachable(f"sandbox not running: {err}") from err
        except (socket.timeout, TimeoutError) as err:
            raise TimeoutError(f"command timed out after {timeout:g}s") from err
        status = data.get("status")
        out, errout = data.get("stdout") or "", data.get("stderr") or ""
        if status == "timed_out":
            raise TimeoutError(f"command timed out after {timeout:g}s")
        if status != "completed" or data.get("exit_code") is None:
            raise OSError(f"exec: command ended with status {status!r}")
        return ExecResult(out, errout, int(data["exit_code"]))

    def open_read(self, path: str) -> Download:
        req = urllib.request.Request(self._base + "/v1/file/download?" + urllib.parse.urlencode({"path": path}), headers=self._headers())
        return Download(_open(req, FILE_TIMEOUT, "read", path))

    def write(self, path: str, data: bytes) -> None:
        parent = path.rsplit("/", 1)[0]
        if parent:
            res = self.run('mkdir -p -- "$SBX_DIR"', {"SBX_DIR": parent}, 30.0)
            if res.exit_code != 0:
                raise OSError(f"write {path}: mkdir {parent}: exit {res.exit_code}: {res.stderr.strip()}")
        boundary = "sandbox-broker-" + uuid.uuid4().hex
        name = path.rsplit("/", 1)[-1].replace('"', "_")
        body = b"".join(
            [
                f'--{boundary}\r\nContent-Disposition: form-data; name="path"\r\n\r\n{path}\r\n'.encode("utf-8"),
                f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename="{name}"\r\n'.encode("utf-8"),
                b"Content-Type: application/octet-stream\r\n\r\n",
                data,
                f"\r\n--{boundary}--\r\n".encode("utf-8"),
            ]
        )
        headers = self._headers()
        headers["Content-Type"] = f"multipart/form-data; boundary={boundary}"
        req = urllib.request.Request(self._base + "/v1/file/upload", data=body, headers=headers, method="POST")
        with _open(req, FILE_TIMEOUT, "write", path) as resp:
            self._envelope(resp, f"write {path}")
