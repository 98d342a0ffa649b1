"""A private redis-server on a free loopback port, for the remote-tier benchmark."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from pathlib import Path

__all__ = ["RedisServer", "why_no_remote"]


def why_no_remote(repo: Path) -> str | None:
    """Why the remote tier cannot be measured here, or None when it can."""
    if not (repo / "src" / "codegen_cache" / "_storage" / "_remote.py").exists():
        return "src/codegen_cache/_storage/_remote.py does not exist (no remote tier)"
    if shutil.which("redis-server") is None:
        return "redis-server is not on PATH (apt-get install redis-server)"
    return None


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class RedisServer:
    """Start redis-server (no persistence) on 127.0.0.1; stop() ends that one process."""

    def __init__(self, workdir: Path, *, priority: int | None = None) -> None:
        self.port = _free_port()
        workdir.mkdir(parents=True, exist_ok=True)
        self.proc = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--dir", str(workdir)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.priority = None
        if priority is not None:
            # Stands in for a server on its own machine: on a loaded shared box, a round trip
            # to it otherwise measures how soon the scheduler runs redis-server.
            try:
                os.setpriority(os.PRIO_PROCESS, self.proc.pid, priority)
                self.priority = priority
            except OSError:
                pass  # not allowed (not root): it runs at the default priority, and the JSON says so
        self._wait()

    def _wait(self, timeout: float = 10.0) -> None:
        deadline = time.monotonic() + timeout
        while True:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5) as sock:
                    sock.sendall(b"PING\r\n")
                    if sock.recv(16).startswith(b"+PONG"):
                        return
            except OSError:
                pass
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"redis-server on port {self.port} did not start")
            time.sleep(0.05)

    def stop(self) -> None:
        """Terminate the server this object started."""
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
