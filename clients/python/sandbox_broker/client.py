"""The broker's HTTP API (v1): acquire, release, sync, get, capacity.

Every call carries ``Authorization: Bearer <token>`` and is bounded by the
client's ``timeout``. A non-2xx answer raises a :class:`BrokerError`
subclass chosen by the reply's ``error.code``.
"""

from __future__ import annotations

import json
import re
import socket
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from typing import Any, Callable

__all__ = [
    "BrokerError",
    "CapacityExceeded",
    "Client",
    "Conflict",
    "Lease",
    "NotFound",
    "Unavailable",
    "ValidationError",
]

# What user_id and thread_id must match (checked here too, so a bad value
# fails before any network call); sandbox ids likewise.
_KEY_PATTERN = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
_ID_PATTERN = re.compile(r"^[A-Za-z0-9_-]{1,128}$")

# Caps on how much of a reply is read.
_MAX_REPLY = 16 << 20
_MAX_ERROR_REPLY = 64 << 10


class BrokerError(Exception):
    """A failed broker call.

    ``status`` is the HTTP status (0 when no answer arrived), ``code`` and
    ``reason`` the reply's machine-readable error code and reason,
    ``retryable`` whether the broker says a retry may succeed, and
    ``retry_after`` the seconds it asks to wait (``Retry-After``), or None.
    """

    def __init__(
        self,
        message: str,
        *,
        status: int = 0,
        code: str = "",
        reason: str = "",
        retryable: bool = False,
        retry_after: float | None = None,
        details: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.code = code
        self.reason = reason
        self.retryable = retryable
        self.retry_after = retry_after
        self.details = details or {}

    def __str__(self) -> str:
        parts = [self.message]
        if self.code:
            parts.append(f"code={self.code}")
        if self.status:
            parts.append(f"status={self.status}")
        if self.reason:
            parts.append(f"reason={self.reason}")
        if self.retry_after is not None:
            parts.append(f"retry_after={self.retry_after:g}s")
        return " ".join(parts)


class CapacityExceeded(BrokerError):
    """No slot: 429 (reason ``capacity`` or ``user_quota``) or 503 while
    the deployment drains (reason ``draining``). ``retry_after`` says when
    to try again."""


class NotFound(BrokerError):
    """The sandbox does not exist or belongs to another tenant."""


class ValidationError(BrokerError, ValueError):
    """The request was refused as malformed; nothing changed. ``reason``
    names the offending field."""


class Conflict(BrokerError):
    """Another request is changing the sandbox, or its state does not allow
    the operation."""


class Unavailable(BrokerError):
    """The broker, its store or the sandbox provider cannot answer now (503),
    or the broker could not be reached at all (``status`` 0)."""


_ERRORS_BY_CODE: dict[str, type[BrokerError]] = {
    "SANDBOX_CAPACITY_EXCEEDED": CapacityExceeded,
    "SANDBOX_NOT_FOUND": NotFound,
    "VALIDATION_ERROR": ValidationError,
    "CONFLICT": Conflict,
    "STORE_UNAVAILABLE": Unavailable,
    "PROVIDER_UNAVAILABLE": Unavailable,
}


@dataclass(frozen=True)
class Lease:
    """The acquire reply: a sandbox handed to a (user, thread).

    ``connection`` is how to reach it, by its ``protocol``:
    ``{"protocol": "envd", "envd_url", "envd_access_token"}`` or
    ``{"protocol": "aio", "sandbox_url", "access_token"?}``. Its tokens are
    secrets (kept out of ``repr``).
    """

    sandbox_id: str
    state: str
    source: str
    backend: str
    connection: dict[str, str] = field(repr=False)
    expires_at: str = ""
    # The thread's outputs brought back into the sandbox by this acquire
    # ({"complete", "restored", "remaining", ...}); None when none ran.
    restore: dict[str, Any] | None = None
    # The thread's earlier sandbox when this acquire replaced one that
    # ended without the thread asking ({"sandbox_id", "reason"}, e.g.
    # reason "provider_timeout"); None otherwise. Only one acquire names it.
    previous: dict[str, str] | None = None

    @property
    def kind(self) -> str:
        """The connection's protocol: ``"envd"`` (E2B envd) or ``"aio"``
        (the AIO sandbox API); ``""`` when the reply does not say."""
        from .sandbox import connection_kind

        return connection_kind(self.connection)


def _error_from_reply(status: int, headers: Any, raw: bytes) -> BrokerError:
    retry_after = _parse_retry_after(headers.get("Retry-After") if headers is not None else None)
    body: dict[str, Any] = {}
    try:
        decoded = json.loads(raw.decode("utf-8"))
        if isinstance(decoded, dict) and isinstance(decoded.get("error"), dict):
            body = decoded["error"]
    except (UnicodeDecodeError, ValueError):
        pass
    code = str(body.get("code") or "")
    message = str(body.get("message") or raw[:200].decode("utf-8", "replace").strip() or f"HTTP {status}")
    if retry_after is None and body.get("retry_after_seconds"):
        retry_after = float(body["retry_after_seconds"])
    cls = _ERRORS_BY_CODE.get(code)
    if cls is None:
        cls = Unavailable if status in (502, 503, 504) else BrokerError
    return cls(
        message,
        status=status,
        code=code,
        reason=str(body.get("reason") or ""),
        retryable=bool(body.get("retryable")),
        retry_after=retry_after,
        details=body.get("details") if isinstance(body.get("details"), dict) else None,
    )


def _parse_retry_after(value: str | None) -> float | None:
    if not value:
        return None
    try:
        seconds = float(value.strip())
    except ValueError:
        return None  # an HTTP date: not sent by the broker
    return max(0.0, seconds)


def _check(pattern: re.Pattern[str], name: str, value: str) -> None:
    if not isinstance(value, str) or not pattern.fullmatch(value):
        raise ValidationError(f"{name} {value!r} must match {pattern.pattern}", code="VALIDATION_ERROR", reason=name)


class Client:
    """A client of the broker API at ``api_url`` with a tenant's ``token``.

    ``timeout`` bounds each HTTP call in seconds (acquire may wait for a
    slot and create a sandbox; release copies outputs first, so keep it
    generous). ``retry_within`` > 0 retries a retryable refusal (capacity,
    an outage, a held lease) after the ``Retry-After`` it carries, as long
    as the retry would start within ``retry_within`` seconds of the first
    attempt; otherwise the last error is raised. Safe for use from several
    threads.
    """

    def __init__(
        self,
        api_url: str,
        token: str,
        timeout: float = 120.0,
        *,
        retry_within: float = 0.0,
        user_agent: str = "sandbox-broker-python",
        sleep: Callable[[float], None] = time.sleep,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        parsed = urllib.parse.urlsplit((api_url or "").strip())
        if parsed.scheme not in ("http", "https") or not parsed.netloc:
            raise ValueError(f"api_url {api_url!r}: want an absolute http:// or https:// URL")
        if timeout <= 0:
            raise ValueError(f"timeout must be positive, got {timeout!r}")
        self.api_url = urllib.parse.urlunsplit((parsed.scheme, parsed.netloc, parsed.path.rstrip("/"), "", ""))
        self._token = token
        self.timeout = float(timeout)
        self.retry_within = max(0.0, float(retry_within))
        self._agent = user_agent
        self._sleep = sleep
        self._clock = clock

    def __repr__(self) -> str:
        return f"Client({self.api_url!r})"

    # ── API ──────────────────────────────────────────────────────────────

    def acquire(self, user_id: str, thread_id: str) -> Lease:
        """Get the thread's sandbox (reused, reclaimed from warm, resumed
        from paused, claimed from the pre-warmed pool, or created). Idempotent for a thread: it answers the same sandbox
        while the thread holds it. Under the overflow policy ``wait`` it
        waits for a slot, asking again with the broker's ticket until it is
        served or refused."""
        _check(_KEY_PATTERN, "user_id", user_id)
        _check(_KEY_PATTERN, "thread_id", thread_id)
        payload: dict[str, Any] = {"user_id": user_id, "thread_id": thread_id}
        while True:
            body = self._call("POST", "/v1/sandboxes/acquire", payload)
            if "sandbox_id" in body or not body.get("ticket"):
                break
            # 202: waiting for a slot. Ask again with the ticket; the broker
            # bounds the whole wait and answers a refusal when it ends.
            payload["ticket"] = str(body["ticket"])
            self._sleep(max(float(body.get("retry_after_seconds") or 1), 1.0))
        conn = body.get("connection") or {}
        return Lease(
            sandbox_id=str(body.get("sandbox_id", "")),
            state=str(body.get("state", "")),
            source=str(body.get("source", "")),
            backend=str(body.get("backend", "")),
            connection={str(k): str(v) for k, v in conn.items() if v is not None},
            expires_at=str(body.get("expires_at") or ""),
            restore=body.get("restore") if isinstance(body.get("restore"), dict) else None,
            previous=body.get("previous") if isinstance(body.get("previous"), dict) else None,
        )

    def release(self, sandbox_id: str) -> dict[str, Any]:
        """Copy the sandbox's outputs to S3 and park it warm for its thread
        (or destroy it while the deployment drains). Returns the reply
        ``{"sandbox_id", "state", "sync", "sync_error"?}``."""
        _check(_ID_PATTERN, "sandbox_id", sandbox_id)
        return self._call("POST", f"/v1/sandboxes/{sandbox_id}/release", None)

    def sync(self, sandbox_id: str) -> dict[str, Any]:
        """Copy the sandbox's outputs to S3 now. Returns
        ``{"uploaded", "skipped", "deferred", "excluded", "bytes", "complete"}``:
        ``deferred`` files a later pass may still copy, ``excluded`` files no
        pass copies as they are (over the per-file cap, unsafe names); a pass
        is ``complete`` when a later one would copy nothing more."""
        _check(_ID_PATTERN, "sandbox_id", sandbox_id)
        return self._call("POST", f"/v1/sandboxes/{sandbox_id}/sync", None)

    def renew(self, sandbox_id: str, seconds: int | None = None) -> dict[str, Any]:
        """Extend the sandbox's lease and its provider timer together, to
        ``seconds`` from now (default: the deployment's active timeout),
        never past its maximum lifetime. Returns ``{"sandbox_id",
        "expires_at"}``. Idempotent: an end is never moved earlier."""
        _check(_ID_PATTERN, "sandbox_id", sandbox_id)
        if seconds is not None and (not isinstance(seconds, int) or isinstance(seconds, bool) or seconds <= 0):
            raise ValidationError("seconds must be a positive integer", reason="seconds")
        body = None if seconds is None else {"seconds": seconds}
        return self._call("POST", f"/v1/sandboxes/{sandbox_id}/renew", body)

    def keep_alive(self, sandbox_id: str, lease_seconds: int) -> "KeepAlive":
        """A context manager that renews the sandbox while a run holds it:
        every third of ``lease_seconds`` it renews for ``lease_seconds``.
        Leaving the block stops it and raises the last renewal it could not
        make, if no later one succeeded (see :class:`KeepAlive`)."""
        from .keepalive import KeepAlive

        return KeepAlive(self, sandbox_id, lease_seconds)

    def get(self, sandbox_id: str) -> dict[str, Any]:
        """The broker's record of the sandbox (``state``, ``user_id``,
        ``thread_id``, ``backend``, timestamps)."""
        _check(_ID_PATTERN, "sandbox_id", sandbox_id)
        return self._call("GET", f"/v1/sandboxes/{sandbox_id}", None)

    def capacity(self) -> dict[str, Any]:
        """Deployment-wide slot usage: ``limit``, ``used``, ``active``,
        ``warm``, ``reserved``, ``transitioning``, ``policy``."""
        return self._call("GET", "/v1/capacity", None)

    # ── transport ────────────────────────────────────────────────────────

    def _call(self, method: str, path: str, payload: dict[str, Any] | None) -> dict[str, Any]:
        start = self._clock()
        while True:
            try:
                return self._once(method, path, payload)
            except BrokerError as err:
                if not (err.retryable and self.retry_within > 0 and err.status):
                    raise
                wait = err.retry_after if err.retry_after is not None else 1.0
                if self._clock() + wait - start > self.retry_within:
                    raise
                self._sleep(wait)

    def _once(self, method: str, path: str, payload: dict[str, Any] | None) -> dict[str, Any]:
        data = None if payload is None else json.dumps(payload).encode("utf-8")
        req = urllib.request.Request(self.api_url + path, data=data, method=method)
        req.add_header("Accept", "application/json")
        req.add_header("User-Agent", self._agent)
        if self._token:
            req.add_header("Authorization", f"Bearer {self._token}")
        if data is not None:
            req.add_header("Content-Type", "application/json")
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as resp:
                raw = resp.read(_MAX_REPLY + 1)
        except urllib.error.HTTPError as err:
            with err:
                raw = err.read(_MAX_ERROR_REPLY)
            raise _error_from_reply(err.code, err.headers, raw) from None
        except (urllib.error.URLError, socket.timeout, ConnectionError, TimeoutError) as err:
            reason = getattr(err, "reason", err)
            raise Unavailable(f"{method} {path}: {reason}", code="", reason="unreachable") from err
        if len(raw) > _MAX_REPLY:
            raise BrokerError(f"{method} {path}: reply larger than {_MAX_REPLY} bytes")
        try:
            body = json.loads(raw.decode("utf-8")) if raw else {}
        except (UnicodeDecodeError, ValueError) as err:
            raise BrokerError(f"{method} {path}: reply is not JSON: {err}") from err
        if not isinstance(body, dict):
            raise BrokerError(f"{method} {path}: reply is not a JSON object")
        return body
