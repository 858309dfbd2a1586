"""Real redis-server processes for the tests: a standalone server and a 3-node Redis Cluster on
loopback ports, each in its own temporary directory, started and stopped by the fixtures in
tests/tiers/conftest.py (nothing started by hand; ``python -m pytest`` works the same locally
and in CI, where .ci/run installs the Debian redis-server package)."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest

REDIS_SERVER = shutil.which("redis-server")
REDIS_CLI = shutil.which("redis-cli")


def require_redis() -> None:
    """Skip (locally) or fail (in CI, where .ci/run must have installed it) without
    redis-server."""
    if REDIS_SERVER and REDIS_CLI:
        return
    msg = "redis-server/redis-cli not installed (apt-get install redis-server)"
    if os.environ.get("CI"):
        pytest.fail(msg)
    pytest.skip(msg)


def free_port(cluster_bus: bool = False) -> int:
    """A loopback TCP port free now (and port + 10000 too, for a cluster node's bus)."""
    for _ in range(200):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if not cluster_bus:
            return port
        if port + 10000 >= 65536:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port + 10000))
            except OSError:
                continue
        return port
    raise RuntimeError("no free loopback port found")


class RedisServer:
    """One redis-server process on 127.0.0.1:``port`` with its files under ``workdir``."""

    def __init__(self, workdir: Path, port: int | None = None, *, cluster: bool = False,
                 password: str | None = None, extra: tuple[str, ...] = ()) -> None:
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.auto_port = port is None
        self.port = port or free_port(cluster)
        self.cluster = cluster
        self.password = password
        self.extra = extra
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        auth = f":{self.password}@" if self.password else ""
        return f"redis://{auth}127.0.0.1:{self.port}/0"

    def start(self, timeout: float = 20.0, attempts: int = 5) -> RedisServer:
        """Start and wait for PING. A port taken between choosing and binding it (other
        processes on this host start servers too) is replaced by a fresh one and retried."""
        for attempt in range(attempts):
            try:
                return self._start_once(timeout)
            except _PortTaken:
                if not self.auto_port or attempt == attempts - 1:
                    raise
                self.port = free_port(self.cluster)
        raise AssertionError("unreachable")

    def _start_once(self, timeout: float) -> RedisServer:
        log = self.workdir / "redis.log"
        if log.exists():
            log.unlink()
        args = [
            REDIS_SERVER, "--port", str(self.port), "--bind", "127.0.0.1",
            "--dir", str(self.workdir), "--save", "", "--appendonly", "no",
            "--daemonize", "no", "--logfile", str(self.workdir / "redis.log"),
            "--maxmemory", "512mb", "--maxmemory-policy", "allkeys-lru",
        ]
        if self.cluster:
            args += ["--cluster-enabled", "yes", "--cluster-config-file",
                     str(self.workdir / "nodes.conf"), "--cluster-node-timeout", "2000"]
        if self.password:
            args += ["--requirepass", self.password]
        args += list(self.extra)
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                err = self.proc.stderr.read().decode(errors="replace") if self.proc.stderr else ""
                text = f"{err} {log.read_text() if log.exists() else ''}"
                if "in use" in text:
                    raise _PortTaken(text)
                raise RuntimeError(f"redis-server on port {self.port} exited: {text}")
            if self.cli("PING", check=False).strip() == "PONG":
                return self
            time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"redis-server on port {self.port} did not answer PING")

    def cli(self, *args: str, check: bool = True) -> str:
        cmd = [REDIS_CLI, "-h", "127.0.0.1", "-p", str(self.port)]
        env = dict(os.environ)
        if self.password:
            env["REDISCLI_AUTH"] = self.password
        try:
            out = subprocess.run(cmd + list(args), capture_output=True, text=True, env=env,
                                 timeout=10, check=False)
        except subprocess.TimeoutExpired:
            if check:
                raise
            return ""
        if check and out.returncode != 0:
            raise RuntimeError(f"redis-cli {args}: {out.stderr}")
        return out.stdout

    def kill(self) -> None:
        """kill -9, as a crash."""
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)

    def pause(self) -> None:
        """SIGSTOP: the server accepts connections (kernel backlog) but answers nothing."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGCONT)

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        if self.proc and self.proc.stderr:
            self.proc.stderr.close()


class _PortTaken(RuntimeError):
    pass


class RedisClusterNodes:
    """A 3-master Redis Cluster (no replicas) on loopback ports."""

    def __init__(self, workdir: Path, nodes: int = 3) -> None:
        self.workdir = Path(workdir)
        self.nodes = nodes
        self.servers: list[RedisServer] = []

    @property
    def url(self) -> str:
        return self.servers[0].url

    def start(self, timeout: float = 60.0, attempts: int = 3) -> RedisClusterNodes:
        """Start the nodes, join them (``redis-cli --cluster create``) and wait for
        ``cluster_state:ok``; a failed attempt (a port taken, a slow host) is retried from
        scratch with fresh ports and directories."""
        errors = []
        for attempt in range(attempts):
            self.servers = [
                RedisServer(self.workdir / f"try{attempt}" / f"node{i}", cluster=True)
                for i in range(self.nodes)
            ]
            try:
                return self._start_once(timeout)
            except (RuntimeError, subprocess.SubprocessError) as exc:
                errors.append(f"{type(exc).__name__}: {exc}")
                self.stop()
        raise RuntimeError(f"3-node cluster did not start: {errors}")

    def _start_once(self, timeout: float) -> RedisClusterNodes:
        for s in self.servers:
            s.start()
        addrs = [f"127.0.0.1:{s.port}" for s in self.servers]
        out = subprocess.run(
            [REDIS_CLI, "--cluster", "create", *addrs, "--cluster-replicas", "0",
             "--cluster-yes"],
            capture_output=True, text=True, timeout=120, check=False,
        )
        if out.returncode != 0:
            raise RuntimeError(f"redis-cli --cluster create: {out.stdout} {out.stderr}")
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if all("cluster_state:ok" in s.cli("CLUSTER", "INFO", check=False)
                   for s in self.servers):
                return self
            time.sleep(0.1)
        raise RuntimeError("cluster did not reach cluster_state:ok")

    def stop(self) -> None:
        for s in self.servers:
            s.stop()


@pytest.fixture
def redis_server(tmp_path_factory):
    """A fresh standalone redis-server for one test (killed/paused by some tests)."""
    require_redis()
    server = RedisServer(tmp_path_factory.mktemp("redis")).start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def shared_redis_server(tmp_path_factory):
    """One standalone redis-server for a whole test module (tests use distinct namespaces)."""
    require_redis()
    server = RedisServer(tmp_path_factory.mktemp("redis-shared")).start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def redis_cluster(tmp_path_factory):
    """A real 3-node Redis Cluster on loopback ports."""
    require_redis()
    cluster = RedisClusterNodes(tmp_path_factory.mktemp("redis-cluster"))
    try:
        cluster.start()
    except BaseException:
        cluster.stop()
        raise
    yield cluster
    cluster.stop()
