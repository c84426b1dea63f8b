"""Real `dlock serve` clusters for the tests.

DLOCK_BIN is the dlock binary (the Go test in test/python builds it and
sets it); tests that need a cluster are skipped without it. DLOCK_TEST_ADDRS,
if set, is a comma-separated pool of free 127.0.0.1:port addresses to use
(the Go test takes them from outside the kernel's ephemeral range);
otherwise ports are picked here.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from typing import List, Optional

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
_used: set = set()


def free_addr() -> str:
    pool = [a for a in os.environ.get("DLOCK_TEST_ADDRS", "").split(",") if a]
    for a in pool:
        if a not in _used:
            _used.add(a)
            return a
    if pool:
        raise RuntimeError("DLOCK_TEST_ADDRS ran out of addresses")
    for _ in range(1000):
        port = random.randint(20000, 31999)
        a = f"127.0.0.1:{port}"
        if a in _used:
            continue
        s = socket.socket()
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            continue
        finally:
            s.close()
        _used.add(a)
        return a
    raise RuntimeError("no free port")


def wait_for(what: str, cond, within: float = 30.0, every: float = 0.05):
    """Polls cond until it returns something true, failing after within."""
    end = time.monotonic() + within
    while True:
        v = cond()
        if v:
            return v
        if time.monotonic() > end:
            raise AssertionError(f"not within {within:g}s: {what}")
        time.sleep(every)


def get_json(url: str, timeout: float = 2.0, context=None):
    try:
        with urllib.request.urlopen(url, timeout=timeout, context=context) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, None
    except (OSError, ValueError):
        return 0, None


class Node:
    def __init__(self, nid: str, api: str, raft: str, data: str, log: str, scheme: str = "http") -> None:
        self.id, self.api, self.raft, self.data, self.log = nid, api, raft, data, log
        self.scheme = scheme
        self.proc: Optional[subprocess.Popen] = None

    @property
    def url(self) -> str:
        return f"{self.scheme}://{self.api}"

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None


class Cluster:
    """n `dlock serve` processes on loopback, stopped at the end of the test."""

    def __init__(self, binary: str, n: int = 3, *, extra_args: Optional[List[str]] = None,
                 ssl_context: Optional["ssl.SSLContext"] = None) -> None:
        self.binary = binary
        self.dir = tempfile.mkdtemp(prefix="dlock-py-")
        self.nodes: List[Node] = []
        self.ssl_context = ssl_context
        for i in range(n):
            nid = f"n{i + 1}"
            self.nodes.append(Node(nid, free_addr(), free_addr(), os.path.join(self.dir, nid), os.path.join(self.dir, nid + ".log"),
                                   "https" if ssl_context else "http"))
        initial = ",".join(f"{nd.id}={nd.raft}" for nd in self.nodes)
        for nd in self.nodes:
            with open(nd.log, "ab") as logf:
                nd.proc = subprocess.Popen([binary, "serve", "--id", nd.id, "--data-dir", nd.data, "--api-addr", nd.api,
                                            "--raft-addr", nd.raft, "--initial-cluster", initial, "--log-level", "warn",
                                            *(extra_args or [])],
                                           stdout=logf, stderr=subprocess.STDOUT)
        wait_for("every node ready", lambda: all(self.get(nd.url + "/readyz")[0] == 200 for nd in self.nodes), 30)
        self.leader()

    def get(self, url: str):
        return get_json(url, context=self.ssl_context)

    @property
    def endpoints(self) -> List[str]:
        return [nd.url for nd in self.nodes]

    def node(self, nid: str) -> Node:
        return next(nd for nd in self.nodes if nd.id == nid)

    def leader(self, within: float = 30.0) -> Node:
        """The node every live node names as leader."""
        def agreed():
            ids = set()
            for nd in self.nodes:
                if not nd.alive():
                    continue
                status, info = self.get(nd.url + "/api/v1/cluster")
                if status != 200 or not info.get("leader_id"):
                    return None
                ids.add(info["leader_id"])
            if len(ids) != 1:
                return None
            leader = self.node(ids.pop())
            return leader if leader.alive() else None
        return wait_for("one live leader that every live node names", agreed, within)

    def kill(self, nd: Node) -> None:
        assert nd.proc is not None
        nd.proc.send_signal(signal.SIGKILL)
        nd.proc.wait(10)

    def stop(self) -> None:
        for nd in self.nodes:
            if nd.alive():
                nd.proc.send_signal(signal.SIGTERM)
        for nd in self.nodes:
            if nd.proc is not None:
                try:
                    nd.proc.wait(10)
                except subprocess.TimeoutExpired:
                    nd.proc.kill()
                    nd.proc.wait(10)

    def logs(self) -> str:
        out = []
        for nd in self.nodes:
            try:
                with open(nd.log, errors="replace") as f:
                    out.append(f"--- {nd.id} ---\n" + "".join(f.readlines()[-30:]))
            except OSError:
                pass
        return "\n".join(out)


@pytest.fixture(scope="session")
def dlock_bin() -> str:
    b = os.environ.get("DLOCK_BIN", "")
    if not b:
        pytest.skip("DLOCK_BIN is not set: go test ./test/python/ builds dlock and runs these tests")
    return b


def _cluster(binary: str, request):
    c = Cluster(binary)
    yield c
    c.stop()
    failed = getattr(request.node, "rep_call", None)
    if failed is not None and failed.failed:
        print(c.logs())
    shutil.rmtree(c.dir, ignore_errors=True)


@pytest.fixture(scope="module")
def cluster(dlock_bin, request):
    """A cluster shared by the tests of a module that kill nothing."""
    yield from _cluster(dlock_bin, request)


@pytest.fixture
def own_cluster(dlock_bin, request):
    """A cluster of the test's own, for tests that kill nodes."""
    yield from _cluster(dlock_bin, request)


@pytest.hookimpl(tryfirst=True, hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    rep = outcome.get_result()
    setattr(item, "rep_" + rep.when, rep)


class Script:
    """A Python script of tests/scripts run as its own process, with lines
    read from its stdout."""

    def __init__(self, name: str, *args: str) -> None:
        self.proc = subprocess.Popen([sys.executable, os.path.join(HERE, "scripts", name), *args],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, bufsize=1)
        self.lines: List[str] = []

    def expect(self, prefix: str, within: float = 30.0) -> str:
        """The next stdout line, which must start with prefix."""
        import selectors
        sel = selectors.DefaultSelector()
        sel.register(self.proc.stdout, selectors.EVENT_READ)
        end = time.monotonic() + within
        while True:
            left = end - time.monotonic()
            if left <= 0 or not sel.select(left):
                raise AssertionError(f"{self.proc.args[1]}: no line {prefix!r} within {within:g}s; stderr: {self.stderr()}")
            line = self.proc.stdout.readline()
            if not line:
                raise AssertionError(f"{self.proc.args[1]} exited ({self.proc.wait()}) before {prefix!r}; stderr: {self.stderr()}")
            line = line.rstrip("\n")
            self.lines.append(line)
            if line.startswith(prefix):
                return line[len(prefix):].strip()
            raise AssertionError(f"{self.proc.args[1]}: got {line!r}, want {prefix!r}")

    def send(self, line: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()

    def stderr(self) -> str:
        if self.proc.poll() is None:
            return "(still running)"
        return self.proc.stderr.read() if self.proc.stderr else ""

    def wait(self, within: float = 30.0) -> int:
        return self.proc.wait(within)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)


@pytest.fixture
def scripts():
    started: List[Script] = []

    def start(name: str, *args: str) -> Script:
        s = Script(name, *args)
        started.append(s)
        return s

    yield start
    for s in started:
        s.kill()
