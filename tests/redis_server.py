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
    """A redis-server process on a free loopback port, in its own directory (TLS: with certs)."""

    def __init__(self, directory: Path, tls: Path | None = None) -> None:
        self.directory = directory
        self.tls = tls
        self.proc: subprocess.Popen | None = None
        self.port = 0
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
                     "--dir", str(directory)],
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


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _need_redis_server() -> None:
    if shutil.which("redis-server") is None:
        pytest.skip("redis-server is not installed (apt-get install redis-server; .ci/run installs it), "
                    "and these tests need a real server")
