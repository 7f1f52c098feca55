"""Tests that need no broker: path mapping, glob scoping, argument checks,
error mapping and the Retry-After retry (against a loopback HTTP server
that injects the refusals)."""

from __future__ import annotations

import http.server
import json
import os
import threading
import unittest
from unittest import mock

from sandbox_broker import (
    BrokerError,
    CapacityExceeded,
    Client,
    Conflict,
    NotFound,
    Sandbox,
    Unavailable,
    ValidationError,
)
from sandbox_broker.deerflow import BrokerSandboxProvider
from sandbox_broker.sandbox import glob_match, validate_env

ENVD = {"envd_url": "http://127.0.0.1:9", "envd_access_token": "t"}


class PathTests(unittest.TestCase):
    def test_resolve_path(self) -> None:
        sb = Sandbox("sb1", ENVD)
        cases = [
            ("/mnt/user-data", "/home/user"),
            ("/mnt/user-data/", "/home/user"),
            ("/mnt/user-data/workspace/a.txt", "/home/user/workspace/a.txt"),
            ("/mnt/user-data//outputs/./x", "/home/user/outputs/x"),
            ("/mnt/user-dataX/a", "/mnt/user-dataX/a"),
            ("/tmp/x", "/tmp/x"),
            ("workspace/a.txt", "/home/user/workspace/a.txt"),
            ("\\mnt\\user-data\\a", "/home/user/a"),
        ]
        for given, want in cases:
            with self.subTest(given=given):
                got = sb.resolve_path(given)
                self.assertEqual(got, want, f"resolve_path({given!r}) = {got!r}, want {want!r}")

    def test_resolve_path_refuses_traversal(self) -> None:
        sb = Sandbox("sb1", ENVD)
        for given in ("/mnt/user-data/../etc/passwd", "../x", "a/../../b", "/mnt/user-data\\..\\x"):
            with self.subTest(given=given), self.assertRaises(PermissionError):
                sb.resolve_path(given)

    def test_download_refuses_before_any_request(self) -> None:
        # The envd URL is a closed port: a request would raise
        # SandboxUnreachable, not PermissionError.
        sb = Sandbox("sb1", ENVD)
        for given in ("/mnt/user-data/../../etc/passwd", "/etc/passwd", "/home/user/outputs/a", "outputs/a", "/mnt/user-dataX/a"):
            with self.subTest(given=given), self.assertRaises(PermissionError):
                sb.download_file(given)
        self.assertFalse(sb.is_dead)

    def test_connection_kind(self) -> None:
        cases = [
            ({"protocol": "envd", "envd_url": "http://127.0.0.1:9"}, "envd"),
            ({"protocol": "aio", "sandbox_url": "http://127.0.0.1:9/s/a"}, "aio"),
            (ENVD, "envd"),  # without protocol: by the URL field
            ({"sandbox_url": "http://127.0.0.1:9/s/a"}, "aio"),
        ]
        for conn, want in cases:
            with self.subTest(conn=conn):
                self.assertEqual(Sandbox("a", conn).kind, want)
        for conn in ({"other": "x"}, {"protocol": "vnc", "sandbox_url": "http://127.0.0.1:9"}):
            with self.subTest(conn=conn), self.assertRaises(ValueError):
                Sandbox("a", conn)


class GlobTests(unittest.TestCase):
    def test_glob_match(self) -> None:
        cases = [
            ("*.py", "a.py", True),
            ("*.py", "deep/dir/a.py", True),
            ("*.py", "a.pyc", False),
            ("src/*.js", "src/app.js", True),
            ("src/*.js", "other_dir/unrelated.js", False),
            ("src/*.js", "x/src/app.js", False),
            ("src/*.js", "src/deep/app.js", False),
            ("src/**/*.js", "src/app.js", True),
            ("src/**/*.js", "src/a/b/app.js", True),
            ("**/*.md", "a/b/c.md", True),
            ("**/*.md", "c.md", True),
            ("./src/*.js", "src/app.js", True),
            ("report.md", "uploads/report.md", True),
        ]
        for pattern, rel, want in cases:
            with self.subTest(pattern=pattern, rel=rel):
                got = glob_match(pattern, rel)
                self.assertEqual(got, want, f"glob_match({pattern!r}, {rel!r}) = {got}, want {want}")

    def test_validate_env(self) -> None:
        validate_env(None)
        validate_env({"A": "1", "_b9": "$(rm -rf /)"})
        for bad in ("X;rm -rf /;Y", "1A", "A-B", "", "A B"):
            with self.subTest(key=bad), self.assertRaises(ValueError):
                validate_env({bad: "v"})

    def test_execute_command_rejects_env_key_before_sending(self) -> None:
        sb = Sandbox("sb1", ENVD)
        with self.assertRaises(ValueError):
            sb.execute_command("echo hi", env={"X;rm -rf /;Y": "v"})
        self.assertFalse(sb.is_dead, "nothing was sent, so nothing could find the sandbox dead")


class _Script(http.server.BaseHTTPRequestHandler):
    """Answers each request with the next (status, headers, body) of the
    server's script and records the request."""

    def _serve(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        self.server.requests.append((self.command, self.path, dict(self.headers), body))  # type: ignore[attr-defined]
        status, headers, reply = self.server.script.pop(0)  # type: ignore[attr-defined]
        raw = json.dumps(reply).encode()
        self.send_response(status)
        for k, v in headers.items():
            self.send_header(k, v)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(raw)))
        self.end_headers()
        self.wfile.write(raw)

    do_GET = do_POST = _serve

    def log_message(self, *args: object) -> None:
        pass


def _error(code: str, reason: str = "", retryable: bool = False) -> dict:
    return {"error": {"code": code, "message": code.lower(), "reason": reason, "retryable": retryable}}


class ClientErrorTests(unittest.TestCase):
    def setUp(self) -> None:
        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Script)
        self.server.script = []  # type: ignore[attr-defined]
        self.server.requests = []  # type: ignore[attr-defined]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.addCleanup(self.server.server_close)
        self.addCleanup(self.server.shutdown)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/prefix"
        self.slept: list[float] = []
        self.now = 0.0

    def sleep(self, s: float) -> None:
        self.slept.append(s)
        self.now += s

    def client(self, retry_within: float = 0.0) -> Client:
        return Client(self.url, "tok", timeout=5, retry_within=retry_within, sleep=self.sleep, clock=lambda: self.now)

    def test_errors_by_code(self) -> None:
        cases = [
            (429, _error("SANDBOX_CAPACITY_EXCEEDED", "capacity", True), {"Retry-After": "5"}, CapacityExceeded, 5.0),
            (503, _error("SANDBOX_CAPACITY_EXCEEDED", "draining", True), {"Retry-After": "30"}, CapacityExceeded, 30.0),
            (404, _error("SANDBOX_NOT_FOUND", "not_found"), {}, NotFound, None),
            (400, _error("VALIDATION_ERROR", "user_id"), {}, ValidationError, None),
            (409, _error("CONFLICT", "lease_held", True), {"Retry-After": "1"}, Conflict, 1.0),
            (503, _error("STORE_UNAVAILABLE", "store_unavailable", True), {"Retry-After": "2"}, Unavailable, 2.0),
            (503, _error("PROVIDER_UNAVAILABLE", "provider_unavailable", True), {"Retry-After": "2"}, Unavailable, 2.0),
            (403, _error("FORBIDDEN", "not_admin"), {}, BrokerError, None),
            (502, {"message": "Internal Server Error"}, {}, Unavailable, None),
        ]
        for status, body, headers, want, retry_after in cases:
            with self.subTest(status=status, body=body):
                self.server.script.append((status, headers, body))  # type: ignore[attr-defined]
                with self.assertRaises(BrokerError) as cm:
                    self.client().capacity()
                err = cm.exception
                self.assertIs(type(err), want, f"got {type(err).__name__}, want {want.__name__}")
                self.assertEqual(err.status, status)
                self.assertEqual(err.retry_after, retry_after)
                self.assertEqual(err.reason, body.get("error", {}).get("reason", ""))

    def test_request_shape(self) -> None:
        self.server.script.append((200, {}, {"sandbox_id": "sb1", "state": "active", "source": "created", "backend": "e2b", "connection": {"envd_url": "http://e", "envd_access_token": "secret"}, "expires_at": "2026-01-01T00:00:00Z", "restore": {"complete": True, "restored": 2}, "previous": {"sandbox_id": "sb0", "reason": "provider_timeout"}}))  # type: ignore[attr-defined]
        lease = self.client().acquire("alice", "t-1")
        self.assertEqual((lease.sandbox_id, lease.kind, lease.expires_at), ("sb1", "envd", "2026-01-01T00:00:00Z"))
        self.assertEqual(lease.restore, {"complete": True, "restored": 2})
        self.assertEqual(lease.previous, {"sandbox_id": "sb0", "reason": "provider_timeout"})
        self.assertNotIn("secret", repr(lease), "the access token must stay out of repr")
        method, path, headers, body = self.server.requests[0]  # type: ignore[attr-defined]
        self.assertEqual((method, path), ("POST", "/prefix/v1/sandboxes/acquire"))
        self.assertEqual(headers.get("Authorization"), "Bearer tok")
        self.assertEqual(json.loads(body), {"user_id": "alice", "thread_id": "t-1"})

    def test_acquire_waits_with_its_ticket(self) -> None:
        waiting = {"ticket": "tk-1", "retry_after_seconds": 3, "wait_until": "2026-01-01T00:00:00Z"}
        self.server.script.extend([  # type: ignore[attr-defined]
            (202, {"Retry-After": "3"}, waiting),
            (202, {"Retry-After": "3"}, dict(waiting, ticket="tk-2")),
            (200, {}, {"sandbox_id": "sb1", "state": "active", "source": "created", "backend": "e2b", "connection": {}, "expires_at": ""}),
        ])
        lease = self.client().acquire("alice", "t-1")
        self.assertEqual(lease.sandbox_id, "sb1")
        sent = [json.loads(r[3]) for r in self.server.requests]  # type: ignore[attr-defined]
        self.assertEqual([b.get("ticket") for b in sent], [None, "tk-1", "tk-2"])
        self.assertEqual(self.slept, [3.0, 3.0])

    def test_renew_sends_seconds(self) -> None:
        self.server.script.extend([(200, {}, {"sandbox_id": "sb1", "expires_at": "2026-01-01T00:00:00Z"})] * 2)  # type: ignore[attr-defined]
        self.client().renew("sb1", 600)
        self.client().renew("sb1")
        sent = [(r[1], r[3]) for r in self.server.requests]  # type: ignore[attr-defined]
        self.assertEqual(sent[0], ("/prefix/v1/sandboxes/sb1/renew", b'{"seconds": 600}'))
        self.assertEqual(sent[1], ("/prefix/v1/sandboxes/sb1/renew", b""))
        with self.assertRaises(ValidationError):
            self.client().renew("sb1", 0)

    def test_keep_alive_reports_a_lost_sandbox(self) -> None:
        ok = (200, {}, {"sandbox_id": "sb1", "expires_at": "2026-01-01T00:00:00Z"})
        gone = (409, {}, _error("CONFLICT", "conflict"))
        self.server.script.extend([ok, ok, gone])  # type: ignore[attr-defined]
        ka = self.client().keep_alive("sb1", 3)
        ka._every = 0.01  # type: ignore[attr-defined]  # tick fast: renewals are counted, not timed
        with self.assertRaises(Conflict):
            with ka:
                ka._thread.join(timeout=30)  # type: ignore[attr-defined]  # ends on the 409
        self.assertEqual(ka.renewals, 2)

    def test_bad_arguments_fail_before_any_request(self) -> None:
        c = self.client()
        for call in (lambda: c.acquire("a b", "t"), lambda: c.acquire("a", "x" * 65), lambda: c.release("../x"), lambda: c.get("")):
            with self.assertRaises(ValidationError):
                call()
        self.assertEqual(self.server.requests, [])  # type: ignore[attr-defined]
        with self.assertRaises(ValueError):
            Client("ftp://x", "t")
        with self.assertRaises(ValueError):
            Client("127.0.0.1:8787", "t")

    def test_retry_honours_retry_after_within_deadline(self) -> None:
        refuse = (429, {"Retry-After": "4"}, _error("SANDBOX_CAPACITY_EXCEEDED", "capacity", True))
        ok = (200, {}, {"limit": 1})
        self.server.script.extend([refuse, refuse, ok])  # type: ignore[attr-defined]
        self.assertEqual(self.client(retry_within=10).capacity(), {"limit": 1})
        self.assertEqual(self.slept, [4.0, 4.0])

    def test_retry_gives_up_when_the_wait_passes_the_deadline(self) -> None:
        refuse = (429, {"Retry-After": "4"}, _error("SANDBOX_CAPACITY_EXCEEDED", "capacity", True))
        self.server.script.extend([refuse, refuse])  # type: ignore[attr-defined]
        with self.assertRaises(CapacityExceeded) as cm:
            self.client(retry_within=6).capacity()
        self.assertEqual(self.slept, [4.0], "a second 4 s wait would end past the 6 s deadline")
        self.assertEqual(cm.exception.retry_after, 4.0)

    def test_no_retry_for_final_refusals_or_by_default(self) -> None:
        self.server.script.append((404, {}, _error("SANDBOX_NOT_FOUND", "not_found")))  # type: ignore[attr-defined]
        with self.assertRaises(NotFound):
            self.client(retry_within=60).get("sb1")
        self.server.script.append((429, {"Retry-After": "1"}, _error("SANDBOX_CAPACITY_EXCEEDED", "capacity", True)))  # type: ignore[attr-defined]
        with self.assertRaises(CapacityExceeded):
            self.client().capacity()
        self.assertEqual(self.slept, [])

    def test_unreachable_broker(self) -> None:
        with self.assertRaises(Unavailable) as cm:
            Client("http://127.0.0.1:9", "t", timeout=2).capacity()
        self.assertEqual(cm.exception.status, 0)


class ProviderConfigTests(unittest.TestCase):
    def test_needs_a_broker_url(self) -> None:
        with mock.patch.dict(os.environ, {"SANDBOX_BROKER_URL": ""}), self.assertRaises(ValueError):
            BrokerSandboxProvider()

    def test_settings_from_the_environment(self) -> None:
        env = {"SANDBOX_BROKER_URL": "http://127.0.0.1:9/api", "SANDBOX_BROKER_TOKEN": "env-token"}
        with mock.patch.dict(os.environ, env):
            p = BrokerSandboxProvider()
            self.assertEqual((p.client.api_url, p.client._token), ("http://127.0.0.1:9/api", "env-token"))
            p = BrokerSandboxProvider(broker_url="http://127.0.0.1:8/", token="arg")
            self.assertEqual((p.client.api_url, p.client._token), ("http://127.0.0.1:8", "arg"), "arguments win")

    def test_keyword_arguments(self) -> None:
        p = BrokerSandboxProvider(broker_url="http://127.0.0.1:9/", token="t", timeout=7)
        self.assertEqual(p.client.api_url, "http://127.0.0.1:9")
        self.assertEqual(p.client.timeout, 7.0)
        self.assertFalse(p.uses_thread_data_mounts)
        self.assertIsNone(p.get("unknown"))
        p.release("unknown")  # holds nothing: no call, no error
        p.shutdown()


if __name__ == "__main__":
    unittest.main()
