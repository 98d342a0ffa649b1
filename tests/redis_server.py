"""A real redis-server on a free loopback port, for the tests of the remote tier."""

from __future__ import annotations

import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest
import redis


class RedisServer:
    """A redis-server process on a free loopback port, in its own directory (TLS: with certs).

    `options` are more redis-server arguments (`["--replicaof", "127.0.0.1", "6379"]`,
    `["--cluster-enabled", "yes"]`, `["--maxmemory", "2mb"]`, ...).
    """

    def __init__(self, directory: Path, tls: Path | None = None, options: list[str] = ()) -> None:
        self.directory = directory
        self.tls = tls
        self.proc: subprocess.Popen | None = None
        self.port = 0
        directory.mkdir(parents=True, exist_ok=True)
        log = directory / "redis-server.log"
        for _attempt in range(5):
            self.port = _free_port()
            ports = ["--port", str(self.port)]
            if tls is not None:
                ports = ["--port", "0", "--tls-port", str(self.port), "--tls-cert-file", str(tls / "server.pem"),
                         "--tls-key-file", str(tls / "server.key"), "--tls-ca-cert-file", str(tls / "ca.pem"),
                         "--tls-auth-clients", "no"]
            with open(log, "wb") as out:
                self.proc = subprocess.Popen(
                    ["redis-server", *ports, "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                     "--dir", str(directory), *options],
                    stdout=out, stderr=subprocess.STDOUT,
                )
            if self._wait_ready():
                return
            self.close()  # the port was taken between the probe and the start: try another
            if tls is not None and "tls" in log.read_text(errors="replace").lower():
                pytest.skip(f"redis-server cannot serve TLS here: {log.read_text(errors='replace')[-300:]}")
        raise RuntimeError(f"redis-server did not start on a loopback port (last tried {self.port})")

    @property
    def url(self) -> str:
        if self.tls is not None:
            return f"rediss://127.0.0.1:{self.port}/0?ssl_ca_certs={self.tls / 'ca.pem'}"
        return f"redis://127.0.0.1:{self.port}/0"

    def client(self):
        if self.tls is not None:
            return redis.Redis(host="127.0.0.1", port=self.port, socket_timeout=5, ssl=True,
                               ssl_ca_certs=str(self.tls / "ca.pem"))
        return redis.Redis(host="127.0.0.1", port=self.port, socket_timeout=5)

    def _wait_ready(self) -> bool:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and self.proc.poll() is None:
            try:
                with self.client() as client:
                    if client.ping():
                        return True
            except redis.ConnectionError:
                time.sleep(0.05)
        return False

    def kill(self) -> None:
        """SIGKILL, as a crash would."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)

    def close(self) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)  # in case a test stopped it
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        self.proc = None


class RedisCluster:
    """A Redis Cluster of `masters` redis-server processes on loopback (no replicas), made with redis-cli."""

    def __init__(self, directory: Path, masters: int = 3) -> None:
        if shutil.which("redis-cli") is None:
            pytest.skip("redis-cli is not installed (it comes with redis-server); the cluster tests need it")
        self.nodes: list[RedisServer] = []
        try:
            for i in range(masters):
                self.nodes.append(RedisServer(directory / f"node{i}", options=[
                    "--cluster-enabled", "yes", "--cluster-config-file", str(directory / f"node{i}" / "nodes.conf"),
                    "--cluster-node-timeout", "2000"]))
            done = subprocess.run(["redis-cli", "--cluster", "create", *(f"127.0.0.1:{n.port}" for n in self.nodes),
                                   "--cluster-replicas", "0", "--cluster-yes"],
                                  capture_output=True, text=True, timeout=60)
            if done.returncode != 0:
                raise RuntimeError(f"redis-cli --cluster create failed: {done.stdout[-1000:]}{done.stderr[-1000:]}")
            self._wait_ok()
        except BaseException:
            self.close()
            raise

    def url(self, node: int = 0) -> str:
        return f"redis://127.0.0.1:{self.nodes[node].port}"

    def client(self):
        return redis.RedisCluster(host="127.0.0.1", port=self.nodes[0].port, socket_timeout=5)

    def node_client(self, node: int):
        return self.nodes[node].client()

    def _wait_ok(self) -> None:
        deadline = time.monotonic() + 30
        while True:
            states = []
            for node in self.nodes:
                with node.client() as client:
                    states.append(client.execute_command("CLUSTER", "INFO").decode())
            if all("cluster_state:ok" in s and "cluster_slots_ok:16384" in s for s in states):
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"the cluster did not become ready: {states[0][:300]}")
            time.sleep(0.1)

    def flush(self) -> None:
        for node in self.nodes:
            with node.client() as client:
                client.flushall()

    def close(self) -> None:
        for node in self.nodes:
            node.close()


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _need_redis_server() -> None:
    if shutil.which("redis-server") is None:
        pytest.skip("redis-server is not installed (apt-get install redis-server; .ci/run installs it), "
                    "and these tests need a real server")
