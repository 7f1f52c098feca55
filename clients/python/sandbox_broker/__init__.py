"""Python client of sandbox-broker (standard library only).

- :class:`Client` calls the broker API: acquire, release, sync, get, capacity.
- :class:`Sandbox` works inside an acquired sandbox with its connection only
  (envd for backend ``e2b``, the AIO sandbox API for backend ``provisioner``).
- :mod:`sandbox_broker.deerflow` holds ``BrokerSandboxProvider``, a sandbox
  provider DeerFlow loads by class path.
"""

from .client import (
    BrokerError,
    CapacityExceeded,
    Client,
    Conflict,
    Lease,
    NotFound,
    Unavailable,
    ValidationError,
)
from .sandbox import MAX_DOWNLOAD_SIZE, VIRTUAL_PREFIX, GrepMatch, Sandbox, SandboxUnreachable

__all__ = [
    "BrokerError",
    "CapacityExceeded",
    "Client",
    "Conflict",
    "GrepMatch",
    "Lease",
    "MAX_DOWNLOAD_SIZE",
    "NotFound",
    "Sandbox",
    "SandboxUnreachable",
    "Unavailable",
    "VIRTUAL_PREFIX",
    "ValidationError",
]

__version__ = "0.1.0"
