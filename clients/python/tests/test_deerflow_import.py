"""BrokerSandboxProvider when DeerFlow is importable.

DeerFlow is not installed here, so a minimal stand-in package with the
same module paths and base-class interface (abstract methods, class
attributes, the capacity exception's keyword arguments, the config's
``sandbox`` section with extra fields) is written to a temporary directory
and the checks run in a fresh interpreter that imports it.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import textwrap
import unittest
from pathlib import Path

PACKAGE_ROOT = Path(__file__).resolve().parent.parent

STUB = {
    "deerflow/__init__.py": "",
    "deerflow/sandbox/__init__.py": "",
    "deerflow/sandbox/search.py": """
        from dataclasses import dataclass

        @dataclass(frozen=True)
        class GrepMatch:
            path: str
            line_number: int
            line: str
    """,
    "deerflow/sandbox/exceptions.py": """
        class SandboxError(Exception):
            pass

        class SandboxCapacityExceededError(SandboxError):
            def __init__(self, message="full", *, active=0, warm=0, reserved=0, replicas=0, retry_after_seconds=5.0, reason="capacity"):
                super().__init__(message)
                self.active, self.warm, self.reserved, self.replicas = active, warm, reserved, replicas
                self.retry_after_seconds, self.reason = retry_after_seconds, reason
    """,
    "deerflow/sandbox/sandbox.py": """
        from abc import ABC, abstractmethod

        class Sandbox(ABC):
            def __init__(self, id):
                self._id = id

            @property
            def id(self):
                return self._id

            @abstractmethod
            def execute_command(self, command, env=None, timeout=None): ...
            @abstractmethod
            def read_file(self, path, start_line=None, end_line=None): ...
            @abstractmethod
            def download_file(self, path): ...
            @abstractmethod
            def list_dir(self, path, max_depth=2): ...
            @abstractmethod
            def write_file(self, path, content, append=False): ...
            @abstractmethod
            def glob(self, path, pattern, *, include_dirs=False, max_results=200): ...
            @abstractmethod
            def grep(self, path, pattern, *, glob=None, literal=False, case_sensitive=False, max_results=100): ...
            @abstractmethod
            def update_file(self, path, content): ...
    """,
    "deerflow/sandbox/sandbox_provider.py": """
        from abc import ABC, abstractmethod

        class SandboxProvider(ABC):
            uses_thread_data_mounts = False
            needs_upload_permission_adjustment = True

            @abstractmethod
            def acquire(self, thread_id=None, *, user_id=None): ...
            @abstractmethod
            def get(self, sandbox_id): ...
            @abstractmethod
            def release(self, sandbox_id): ...
            def reset(self):
                pass
    """,
    "deerflow/config/__init__.py": """
        from types import SimpleNamespace

        class _Section:
            use = "sandbox_broker.deerflow:BrokerSandboxProvider"
            model_extra = {"broker_url": "http://127.0.0.1:9/from-config", "token": "config-token", "timeout": 9}

        def get_app_config():
            return SimpleNamespace(sandbox=_Section())
    """,
}

CHECKS = """
import sandbox_broker.deerflow as bd
from deerflow.sandbox.exceptions import SandboxCapacityExceededError
from deerflow.sandbox.sandbox import Sandbox
from deerflow.sandbox.sandbox_provider import SandboxProvider
from sandbox_broker import CapacityExceeded

assert bd.DEERFLOW_AVAILABLE
assert issubclass(bd.BrokerSandboxProvider, SandboxProvider)
assert issubclass(bd.BrokerSandbox, Sandbox)
sb = bd.BrokerSandbox("sb1", {"envd_url": "http://127.0.0.1:9"})  # abstract methods all implemented
assert sb.id == "sb1" and isinstance(sb, Sandbox)

p = bd.BrokerSandboxProvider()  # as DeerFlow builds it: settings from its config
assert p.client.api_url == "http://127.0.0.1:9/from-config", p.client.api_url
assert p.client._token == "config-token" and p.client.timeout == 9.0
assert p.uses_thread_data_mounts is False

class Full:
    def acquire(self, user, thread):
        raise CapacityExceeded("full", status=429, code="SANDBOX_CAPACITY_EXCEEDED", reason="user_quota",
                               retryable=True, retry_after=7.0, details={"active": 1, "limit": 2})

p = bd.BrokerSandboxProvider(client=Full())
try:
    p.acquire("t1", user_id="u1")
except SandboxCapacityExceededError as err:
    assert (err.reason, err.retry_after_seconds, err.active, err.replicas) == ("user_quota", 7.0, 1, 2), vars(err)
    assert isinstance(err.__cause__, CapacityExceeded)
else:
    raise AssertionError("no SandboxCapacityExceededError")
print("ok")
"""


class DeerFlowImportTests(unittest.TestCase):
    def test_subclasses_deerflow_when_importable(self) -> None:
        with tempfile.TemporaryDirectory() as stub:
            for rel, text in STUB.items():
                path = Path(stub, rel)
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(textwrap.dedent(text))
            env = dict(os.environ, PYTHONPATH=os.pathsep.join([stub, str(PACKAGE_ROOT)]))
            env.pop("SANDBOX_BROKER_URL", None)
            proc = subprocess.run([sys.executable, "-c", CHECKS], env=env, capture_output=True, text=True, timeout=60)
        self.assertEqual(proc.returncode, 0, f"stdout:\n{proc.stdout}\nstderr:\n{proc.stderr}")
        self.assertEqual(proc.stdout.strip(), "ok")


if __name__ == "__main__":
    unittest.main()
