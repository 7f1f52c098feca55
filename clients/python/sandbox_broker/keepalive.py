"""Keeping a sandbox's lease alive while a run holds it."""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any

from .client import BrokerError, Conflict, NotFound

if TYPE_CHECKING:
    from .client import Client

__all__ = ["KeepAlive"]


class KeepAlive:
    """Renews a sandbox's lease from a background thread.

    Every third of ``lease_seconds`` it asks the broker to extend the lease
    to ``lease_seconds`` from then. A renewal that fails is kept in
    :attr:`error` (and tried again at the next tick) until one succeeds; a
    sandbox that is gone or no longer active (404, 409) stops the thread.
    Used as a context manager, leaving the block stops the thread and
    raises :attr:`error` if it is set, so a lost lease is never hidden.
    """

    def __init__(self, client: "Client", sandbox_id: str, lease_seconds: int) -> None:
        if not isinstance(lease_seconds, int) or lease_seconds < 3:
            raise ValueError("lease_seconds must be an integer of at least 3")
        self._client = client
        self._id = sandbox_id
        self._lease = lease_seconds
        self._every = lease_seconds / 3
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._error: BrokerError | None = None
        self.renewals = 0
        self._thread = threading.Thread(target=self._run, name=f"keep-alive-{sandbox_id}", daemon=True)

    @property
    def error(self) -> BrokerError | None:
        """The last renewal that failed, unless a later one succeeded."""
        with self._lock:
            return self._error

    def start(self) -> "KeepAlive":
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop renewing; the lease then runs out at its current end."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()

    def _run(self) -> None:
        while not self._stop.wait(self._every):
            try:
                self._client.renew(self._id, self._lease)
            except (NotFound, Conflict) as err:
                with self._lock:
                    self._error = err
                return
            except BrokerError as err:
                with self._lock:
                    self._error = err
                continue
            with self._lock:
                self._error = None
                self.renewals += 1

    def __enter__(self) -> "KeepAlive":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()
        err = self.error
        if err is not None and exc[0] is None:
            raise err
