"""Tests against a running broker (the local stack started by the Go test
that runs this suite, test/e2e TestPythonClient).

Environment: SANDBOX_BROKER_URL, SANDBOX_BROKER_TOKEN (tenant A),
SANDBOX_BROKER_OTHER_TOKEN (tenant B), SANDBOX_BROKER_BACKEND (the
functions' backend: e2b or provisioner). The stack has one slot and
overflow policy reject. Without these variables the tests are skipped (run
them through `go test ./test/e2e -run TestPythonClient`).
"""

from __future__ import annotations

import errno
import os
import unittest
import uuid

from sandbox_broker import CapacityExceeded, Client, NotFound, Sandbox, ValidationError
from sandbox_broker.deerflow import BrokerSandbox, BrokerSandboxProvider

URL = os.environ.get("SANDBOX_BROKER_URL", "")
TOKEN = os.environ.get("SANDBOX_BROKER_TOKEN", "")
OTHER_TOKEN = os.environ.get("SANDBOX_BROKER_OTHER_TOKEN", "")
BACKEND = os.environ.get("SANDBOX_BROKER_BACKEND", "")
KIND = {"e2b": "envd", "provisioner": "aio"}.get(BACKEND, "")

needs_stack = unittest.skipUnless(URL and TOKEN and OTHER_TOKEN and KIND, "no broker: set SANDBOX_BROKER_URL, _TOKEN, _OTHER_TOKEN, _BACKEND")


def _thread() -> str:
    return "t-" + uuid.uuid4().hex[:12]


@needs_stack
class StackTest(unittest.TestCase):
    """One sandbox held for the class (the stack has one slot)."""

    client: Client
    lease: object
    sb: Sandbox

    @classmethod
    def setUpClass(cls) -> None:
        cls.client = Client(URL, TOKEN, timeout=120)
        cls.user, cls.thread = "alice", _thread()
        cls.lease = cls.client.acquire(cls.user, cls.thread)
        cls.sb = Sandbox.from_lease(cls.lease, command_timeout=60)

    @classmethod
    def tearDownClass(cls) -> None:
        cls.client.release(cls.lease.sandbox_id)


class ClientTests(StackTest):
    def test_acquire_get_capacity(self) -> None:
        lease = self.lease
        self.assertEqual((lease.state, lease.backend, lease.kind), ("active", BACKEND, KIND))
        again = self.client.acquire(self.user, self.thread)
        self.assertEqual(again.sandbox_id, lease.sandbox_id, "acquire is idempotent for a thread")
        self.assertEqual(again.source, "reused")
        rec = self.client.get(lease.sandbox_id)
        self.assertEqual((rec["state"], rec["user_id"], rec["thread_id"]), ("active", self.user, self.thread))
        cap = self.client.capacity()
        # used is the ledger's, read at once; the counts by state are
        # reconcile's last pass (counted_at).
        self.assertEqual((cap["limit"], cap["used"]), (1, 1))
        self.assertIn("active", cap)

    def test_sync(self) -> None:
        self.sb.write_file("/mnt/user-data/outputs/sync-me.txt", "synced\n")
        res = self.client.sync(self.lease.sandbox_id)
        self.assertTrue(res["complete"], res)
        self.assertGreaterEqual(res["uploaded"] + res["skipped"], 1, res)

    def test_error_kinds(self) -> None:
        other = Client(URL, OTHER_TOKEN)
        with self.assertRaises(NotFound) as cm:
            other.get(self.lease.sandbox_id)
        self.assertEqual((cm.exception.status, cm.exception.reason), (404, "not_found"))
        with self.assertRaises(NotFound):
            other.release(self.lease.sandbox_id)
        with self.assertRaises(NotFound):
            self.client.get("no-such-sandbox")
        # The broker's own validation (the client checks first; bypass it).
        with self.assertRaises(ValidationError) as cm2:
            self.client._call("POST", "/v1/sandboxes/acquire", {"user_id": "a b", "thread_id": "t"})
        self.assertEqual((cm2.exception.status, cm2.exception.reason), (400, "user_id"))

    def test_capacity_exceeded_and_retry(self) -> None:
        # The one slot is held by this class's sandbox.
        with self.assertRaises(CapacityExceeded) as cm:
            self.client.acquire("bob", _thread())
        err = cm.exception
        self.assertEqual((err.status, err.code, err.reason), (429, "SANDBOX_CAPACITY_EXCEEDED", "capacity"))
        self.assertIsNotNone(err.retry_after)
        self.assertGreater(err.retry_after, 0)

        # A deadline shorter than Retry-After: no wait, the refusal is raised.
        slept: list[float] = []
        short = Client(URL, TOKEN, retry_within=err.retry_after / 2, sleep=slept.append)
        with self.assertRaises(CapacityExceeded):
            short.acquire("bob", _thread())
        self.assertEqual(slept, [])

        # Within the deadline: the client waits Retry-After, then retries.
        # The "wait" frees the slot, so the retry succeeds.
        waits: list[float] = []

        def free_slot(seconds: float) -> None:
            waits.append(seconds)
            self.client.release(self.lease.sandbox_id)

        patient = Client(URL, TOKEN, retry_within=err.retry_after * 3, sleep=free_slot)
        bob = patient.acquire("bob", _thread())
        try:
            self.assertEqual(waits, [err.retry_after])
            self.assertEqual(bob.state, "active")
        finally:
            self.client.release(bob.sandbox_id)
            type(self).lease = self.client.acquire(self.user, self.thread)
            type(self).sb = Sandbox.from_lease(self.lease, command_timeout=60)


class SandboxTests(StackTest):
    def test_execute_command(self) -> None:
        self.assertEqual(self.sb.execute_command("echo hello").strip(), "hello")
        self.assertEqual(self.sb.execute_command("pwd").strip(), "/home/user")
        self.assertEqual(self.sb.execute_command("true"), "(no output)")
        self.assertEqual(self.sb.execute_command("exit 3"), "Command exited with code 3")
        out = self.sb.execute_command("echo out; echo err >&2; exit 1")
        self.assertIn("out", out)
        self.assertIn("err", out)

    def test_env_values_are_never_interpolated(self) -> None:
        marker = "/home/user/pwned-" + uuid.uuid4().hex[:6]
        value = f"$(touch {marker}); `touch {marker}` 'q\"d"
        out = self.sb.execute_command('printf %s "$SECRET"', env={"SECRET": value})
        self.assertEqual(out, value)
        self.assertEqual(self.sb.execute_command(f"test -e {marker} && echo yes || echo no").strip(), "no")
        self.assertEqual(self.sb.execute_command("printf %s \"${SECRET:-unset}\"").strip(), "unset", "env is per call")
        with self.assertRaises(ValueError):
            self.sb.execute_command("echo", env={"BAD KEY": "v"})

    def test_command_timeout(self) -> None:
        out = self.sb.execute_command("sleep 30", timeout=1)
        self.assertTrue(out.startswith("Error:"), out)
        self.assertIn("timed out", out)
        self.assertFalse(self.sb.is_dead)

    def test_files(self) -> None:
        base = "/mnt/user-data/workspace/files-" + uuid.uuid4().hex[:6]
        self.sb.write_file(f"{base}/deep/range.txt", "line 1\nline 2\nline 3\nline 4\nline 5")
        read = self.sb.read_file
        self.assertEqual(read(f"{base}/deep/range.txt"), "line 1\nline 2\nline 3\nline 4\nline 5")
        cases = [((2, 4), "line 2\nline 3\nline 4"), ((4, None), "line 4\nline 5"), ((None, 2), "line 1\nline 2"), ((3, 3), "line 3")]
        for (start, end), want in cases:
            with self.subTest(start=start, end=end):
                self.assertEqual(read(f"{base}/deep/range.txt", start_line=start, end_line=end), want)
        self.assertTrue(read(f"{base}/missing.txt").startswith("Error:"))
        # The virtual prefix is the sandbox home.
        self.assertEqual(self.sb.execute_command(f"cat {self.sb.resolve_path(base)}/deep/range.txt | wc -l").strip(), "4")

        self.sb.write_file(f"{base}/log.txt", "a\n", append=True)
        self.sb.write_file(f"{base}/log.txt", "b\n", append=True)
        self.assertEqual(read(f"{base}/log.txt"), "a\nb\n")
        self.sb.write_file(f"{base}/log.txt", "c\n")
        self.assertEqual(read(f"{base}/log.txt"), "c\n")

        blob = bytes(range(256)) * 64
        self.sb.update_file(f"{base}/blob.bin", blob)
        self.assertEqual(self.sb.download_file(f"{base}/blob.bin"), blob)

    def test_download_refusals(self) -> None:
        with self.assertRaises(PermissionError):
            self.sb.download_file("/mnt/user-data/../../etc/passwd")
        with self.assertRaises(PermissionError):
            self.sb.download_file("/etc/passwd")
        with self.assertRaises(FileNotFoundError):
            self.sb.download_file("/mnt/user-data/outputs/no-such-file")
        name = "big-" + uuid.uuid4().hex[:6]
        self.sb.execute_command(f"truncate -s 101M /home/user/outputs/{name}")
        try:
            with self.assertRaises(OSError) as cm:
                self.sb.download_file(f"/mnt/user-data/outputs/{name}")
            self.assertEqual(cm.exception.errno, errno.EFBIG)
        finally:
            self.sb.execute_command(f"rm -f /home/user/outputs/{name}")

    def test_list_glob_grep(self) -> None:
        root = "/mnt/user-data/workspace/tree-" + uuid.uuid4().hex[:6]
        files = {
            "src/app.js": "console.log('needle in src');\n",
            "src/lib/util.js": "// NEEDLE deeper\n",
            "other_dir/unrelated.js": "console.log('needle in other_dir');\n",
            "other_dir/deep/mod.py": "x = 1\nneedle = 'a.b'\n",
            "notes.md": "no match here\nneedle in notes\n",
            "node_modules/dep/index.js": "needle in a dependency\n",
        }
        for rel, text in files.items():
            self.sb.write_file(f"{root}/{rel}", text)
        home = self.sb.resolve_path(root)

        listing = self.sb.list_dir(root, max_depth=1)
        self.assertEqual(sorted(listing), sorted(f"{home}/{n}" for n in ("src", "other_dir", "notes.md", "node_modules")))
        self.assertIn(f"{home}/src/lib", self.sb.list_dir(root))
        self.assertEqual(self.sb.list_dir(root + "/nope"), [])

        glob_cases = [
            ("*.js", False, {"src/app.js", "src/lib/util.js", "other_dir/unrelated.js"}),
            ("src/*.js", False, {"src/app.js"}),
            ("src/**/*.js", False, {"src/app.js", "src/lib/util.js"}),
            ("*.py", False, {"other_dir/deep/mod.py"}),
            ("src*", True, {"src"}),
        ]
        for pattern, dirs, want in glob_cases:
            with self.subTest(glob=pattern):
                got, truncated = self.sb.glob(root, pattern, include_dirs=dirs)
                self.assertEqual(set(got), {f"{home}/{w}" for w in want})
                self.assertFalse(truncated)
        got, truncated = self.sb.glob(root, "*.js", max_results=2)
        self.assertEqual((len(got), truncated), (2, True))

        def grep(**kw: object) -> set[str]:
            matches, truncated = self.sb.grep(kw.pop("path", root), kw.pop("pattern", "needle"), **kw)  # type: ignore[arg-type]
            self.assertFalse(truncated)
            return {m.path[len(home) + 1 :] if m.path.startswith(home + "/") else m.path for m in matches}

        self.assertEqual(grep(glob="src/*.js"), {"src/app.js"})
        self.assertEqual(grep(glob="*.js"), {"src/app.js", "src/lib/util.js", "other_dir/unrelated.js"})
        self.assertEqual(grep(glob="*.js", case_sensitive=True), {"src/app.js", "other_dir/unrelated.js"})
        self.assertEqual(grep(), {"src/app.js", "src/lib/util.js", "other_dir/unrelated.js", "other_dir/deep/mod.py", "notes.md"})
        self.assertEqual(grep(pattern="a.b", literal=True), {"other_dir/deep/mod.py"})
        self.assertEqual(grep(pattern="needle in (src|notes)"), {"src/app.js", "notes.md"})
        self.assertEqual(grep(path=f"{root}/notes.md", glob="*.md"), {"notes.md"})
        self.assertEqual(grep(path=f"{root}/notes.md", glob="*.txt"), set())
        matches, _ = self.sb.grep(root, "needle in notes")
        self.assertEqual([(m.path, m.line_number, m.line) for m in matches], [(f"{home}/notes.md", 2, "needle in notes")])
        matches, truncated = self.sb.grep(root, "needle", max_results=2)
        self.assertEqual((len(matches), truncated), (2, True))

    def test_foreign_token_is_refused_not_dead(self) -> None:
        # The sandbox host checks the token first: another sandbox's token
        # on an unknown id is refused, and tells nothing of the id, so the
        # sandbox is not taken for dead.
        conn = dict(self.lease.connection)
        if KIND == "aio":
            conn["sandbox_url"] = conn["sandbox_url"].rstrip("/").rsplit("/", 1)[0] + "/no-such-sandbox"
        other = Sandbox("no-such-sandbox", conn)
        out = other.execute_command("echo hi")
        self.assertTrue(out.startswith("Error:"), out)
        self.assertFalse(other.is_dead)


@needs_stack
class DeerFlowProviderTests(unittest.TestCase):
    def test_provider_lifecycle(self) -> None:
        p = BrokerSandboxProvider(broker_url=URL, token=TOKEN, user_id="carol")
        thread = _thread()
        sid = p.acquire(thread)
        sb = p.get(sid)
        self.assertIsInstance(sb, BrokerSandbox)
        self.assertEqual(sb.id, sid)
        self.assertEqual(sb.execute_command("echo ok").strip(), "ok")
        self.assertEqual(p.client.get(sid)["user_id"], "carol")

        # get and a repeated acquire answer from memory: they work with the
        # broker unreachable.
        live = p._client
        p._client = Client("http://127.0.0.1:9", "x", timeout=2)
        try:
            self.assertIs(p.get(sid), sb)
            self.assertEqual(p.acquire(thread), sid)
        finally:
            p._client = live

        p.release(sid)
        self.assertIsNone(p.get(sid))
        self.assertEqual(live.get(sid)["state"], "warm")
        # The thread's next run gets the same sandbox back.
        self.assertEqual(p.acquire(thread, user_id="carol"), sid)
        p.shutdown()
        self.assertEqual(p.held(), [])
        self.assertEqual(live.get(sid)["state"], "warm")

    def test_capacity_refusal_is_raised(self) -> None:
        p = BrokerSandboxProvider(broker_url=URL, token=TOKEN)
        first = p.acquire(_thread(), user_id="dave")
        try:
            with self.assertRaises(Exception) as cm:
                p.acquire(_thread(), user_id="erin")
            err = cm.exception
            self.assertEqual(getattr(err, "reason", None), "capacity")
        finally:
            p.reset()
        self.assertEqual(Client(URL, TOKEN).get(first)["state"], "warm")


if __name__ == "__main__":
    unittest.main()
