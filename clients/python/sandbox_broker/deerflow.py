"""A DeerFlow sandbox provider backed by the broker.

DeerFlow loads it by class path from its ``config.yaml``::

    sandbox:
      use: sandbox_broker.deerflow:BrokerSandboxProvider
      broker_url: https://broker.example.com
      token: $BROKER_TOKEN

When DeerFlow is importable, :class:`BrokerSandboxProvider` and
:class:`BrokerSandbox` subclass its ``SandboxProvider`` and ``Sandbox`` base
classes, grep answers DeerFlow's ``GrepMatch`` and a refused acquire raises
its ``SandboxCapacityExceededError``; without DeerFlow they work on their own
(settings from keyword arguments or ``SANDBOX_BROKER_URL`` /
``SANDBOX_BROKER_TOKEN``).
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import uuid
from typing import Any

from .client import CapacityExceeded, Client, NotFound
from .sandbox import Sandbox

logger = logging.getLogger(__name__)

try:  # DeerFlow present: plug into its interfaces.
    from deerflow.sandbox.exceptions import SandboxCapacityExceededError as _DeerFlowCapacityError
    from deerflow.sandbox.sandbox import Sandbox as _SandboxBase
    from deerflow.sandbox.sandbox_provider import SandboxProvider as _ProviderBase
    from deerflow.sandbox.search import GrepMatch as _DeerFlowGrepMatch

    DEERFLOW_AVAILABLE = True
except ImportError:  # standalone
    _SandboxBase = object  # type: ignore[assignment,misc]
    _ProviderBase = object  # type: ignore[assignment,misc]
    _DeerFlowCapacityError = None  # type: ignore[assignment,misc]
    _DeerFlowGrepMatch = None  # type: ignore[assignment,misc]
    DEERFLOW_AVAILABLE = False

__all__ = ["BrokerSandbox", "BrokerSandboxProvider", "DEERFLOW_AVAILABLE"]

# DeerFlow's user id when a request carries none.
DEFAULT_USER_ID = "default"


class BrokerSandbox(Sandbox, _SandboxBase):  # type: ignore[misc,valid-type]
    """:class:`sandbox_broker.Sandbox` with DeerFlow's ``Sandbox`` interface."""

    def grep(self, path: str, pattern: str, **kwargs: Any) -> tuple[list[Any], bool]:
        matches, truncated = super().grep(path, pattern, **kwargs)
        if _DeerFlowGrepMatch is not None:
            matches = [_DeerFlowGrepMatch(path=m.path, line_number=m.line_number, line=m.line) for m in matches]
        return matches, truncated


def _deerflow_settings() -> dict[str, Any]:
    """The ``sandbox:`` section of DeerFlow's config (extra fields allowed),
    or {} outside DeerFlow."""
    if not DEERFLOW_AVAILABLE:
        return {}
    try:
        from deerflow.config import get_app_config

        section = get_app_config().sandbox
    except Exception as err:  # noqa: BLE001 - no config: keyword arguments only
        logger.debug("no DeerFlow sandbox config: %s", err)
        return {}
    extra = dict(getattr(section, "model_extra", None) or {})
    for name in ("broker_url", "token", "timeout", "retry_within", "user_id"):
        if name not in extra and getattr(section, name, None) is not None:
            extra[name] = getattr(section, name)
    return extra


class BrokerSandboxProvider(_ProviderBase):  # type: ignore[misc,valid-type]
    """DeerFlow's provider interface over the broker: ``acquire`` asks the
    broker for the thread's sandbox, ``get`` answers from memory (no
    network call: DeerFlow calls it on its event loop), ``release`` hands
    the sandbox back (its outputs go to S3 and it stays warm for the
    thread), ``reset``/``shutdown`` release everything this instance holds.

    Settings, first found wins: keyword arguments, DeerFlow's ``sandbox:``
    config section, the environment (``SANDBOX_BROKER_URL``,
    ``SANDBOX_BROKER_TOKEN``). ``broker_url`` is required.
    """

    # The broker's sandboxes are remote: DeerFlow copies uploads in.
    uses_thread_data_mounts = False

    def __init__(
        self,
        broker_url: str | None = None,
        token: str | None = None,
        *,
        timeout: float | None = None,
        retry_within: float | None = None,
        user_id: str | None = None,
        client: Client | None = None,
        **unknown: Any,
    ) -> None:
        settings = _deerflow_settings()
        if unknown:
            logger.warning("BrokerSandboxProvider: ignoring unknown settings %s", ", ".join(sorted(unknown)))
        if client is None:
            url = broker_url or settings.get("broker_url") or os.environ.get("SANDBOX_BROKER_URL")
            if not url:
                raise ValueError("BrokerSandboxProvider: broker_url is required (argument, sandbox.broker_url, or SANDBOX_BROKER_URL)")
            tok = token or settings.get("token") or os.environ.get("SANDBOX_BROKER_TOKEN") or ""
            client = Client(
                url,
                tok,
                timeout=float(timeout or settings.get("timeout") or 120.0),
                retry_within=float(retry_within if retry_within is not None else settings.get("retry_within") or 0.0),
            )
        self._client = client
        self._default_user = user_id or settings.get("user_id") or DEFAULT_USER_ID
        self._lock = threading.Lock()
        self._sandboxes: dict[str, BrokerSandbox] = {}
        self._threads: dict[tuple[str, str], str] = {}

    @property
    def client(self) -> Client:
        return self._client

    def acquire(self, thread_id: str | None = None, *, user_id: str | None = None) -> str:
        """The id of the thread's sandbox. Without a thread id a fresh
        one-off thread is used (the broker keys every sandbox by thread)."""
        user = user_id or self._default_user
        thread = thread_id or "oneoff-" + uuid.uuid4().hex
        key = (user, thread)
        with self._lock:
            sid = self._threads.get(key)
            held = self._sandboxes.get(sid) if sid else None
            if held is not None and not held.is_dead:
                return held.id
        try:
            lease = self._client.acquire(user, thread)
        except CapacityExceeded as err:
            if _DeerFlowCapacityError is None:
                raise
            raise _DeerFlowCapacityError(
                str(err),
                retry_after_seconds=err.retry_after if err.retry_after is not None else 5.0,
                reason=err.reason or "capacity",
                # The refusal counts the slots in use, not their states.
                active=int(err.details.get("active", err.details.get("used", 0)) or 0),
                warm=int(err.details.get("warm", 0) or 0),
                reserved=int(err.details.get("reserved", 0) or 0),
                replicas=int(err.details.get("limit", 0) or 0),
            ) from err
        sandbox = BrokerSandbox.from_lease(lease)
        with self._lock:
            self._sandboxes[lease.sandbox_id] = sandbox
            self._threads[key] = lease.sandbox_id
        return lease.sandbox_id

    async def acquire_async(self, thread_id: str | None = None, *, user_id: str | None = None) -> str:
        """:meth:`acquire` on a worker thread."""
        return await asyncio.to_thread(self.acquire, thread_id, user_id=user_id)

    def get(self, sandbox_id: str) -> BrokerSandbox | None:
        """The sandbox this provider holds under ``sandbox_id``, or None."""
        with self._lock:
            return self._sandboxes.get(sandbox_id)

    def release(self, sandbox_id: str) -> None:
        """Hand the sandbox back to the broker. Releasing one this provider
        does not hold, or one the broker no longer knows, is a no-op; other
        failures are logged (the broker's reconcile pass ends sandboxes
        left active)."""
        with self._lock:
            sandbox = self._sandboxes.pop(sandbox_id, None)
            for key in [k for k, v in self._threads.items() if v == sandbox_id]:
                del self._threads[key]
        if sandbox is None:
            return
        try:
            self._client.release(sandbox_id)
        except NotFound:
            pass
        except Exception as err:  # noqa: BLE001 - DeerFlow releases in cleanup paths
            logger.warning("release %s: %s", sandbox_id, err)

    def held(self) -> list[str]:
        """The ids of the sandboxes this provider holds."""
        with self._lock:
            return list(self._sandboxes)

    def reset(self) -> None:
        """Release every sandbox this provider holds."""
        for sid in self.held():
            self.release(sid)

    def shutdown(self) -> None:
        """Release every sandbox this provider holds (idempotent)."""
        self.reset()
