"""A real Tidemark server for the tests: the binary `cargo build` made (or $TIDEMARK_BIN),
started on free ports over a temporary data directory, stopped by PID at the end."""

from __future__ import annotations

import os
import socket
import ssl
import subprocess
import time
import urllib.request
from pathlib import Path
from typing import Iterator

import pytest

import tidemark

REPO = Path(__file__).resolve().parents[2]
TLS_FIXTURES = REPO / "crates" / "tidemark-server" / "tests" / "tls"
TLS_CA = TLS_FIXTURES / "ca.pem"


def binary() -> Path:
    path = Path(os.environ.get("TIDEMARK_BIN", REPO / "target" / "debug" / "tidemark"))
    if not path.exists():
        pytest.fail(f"no tidemark binary at {path}: run `cargo test --workspace --no-run` or set TIDEMARK_BIN")
    return path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Server:
    """One `tidemark serve` process."""

    def __init__(self, data_dir: Path, config: str = "", tls: bool = False) -> None:
        """`tls`: both listeners speak TLS only, with the test certificate of the server's
        Rust tests (for 127.0.0.1, signed by their test CA, `TLS_CA`)."""
        self.port = free_port()
        self.url = f"{'https' if tls else 'http'}://127.0.0.1:{self.port}"
        self.ssl_context = ssl.create_default_context(cafile=str(TLS_CA)) if tls else None
        if tls:
            config += f'\n[tls]\ncert = "{TLS_FIXTURES / "cert.pem"}"\nkey = "{TLS_FIXTURES / "key.pem"}"\n'

        args = [str(binary()), "serve", "--data-dir", str(data_dir),
                "--http", f"127.0.0.1:{self.port}", "--binary", f"127.0.0.1:{free_port()}"]
        if config:
            path = data_dir.parent / f"{data_dir.name}.toml"
            path.write_text(config)
            args += ["--config", str(path)]
        self.args = args
        self.log = open(data_dir.parent / f"{data_dir.name}.log", "ab")
        self.start()

    def start(self) -> None:
        """Starts the process (again, after :meth:`kill`: same ports, same data)."""
        self.process = subprocess.Popen(self.args, stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 30
        while True:
            try:
                with urllib.request.urlopen(self.url + "/ready", timeout=1, context=self.ssl_context) as answer:
                    if answer.status == 200:
                        return
            except OSError:
                pass
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"the server did not start; its log: {self.log.name}")
            time.sleep(0.05)

    def metric(self, name: str) -> float:
        """The sum of a metric's samples in /metrics (0 when absent)."""
        with urllib.request.urlopen(self.url + "/metrics", timeout=5) as answer:
            text = answer.read().decode()
        total = 0.0
        for line in text.splitlines():
            if line.startswith(name + " ") or line.startswith(name + "{"):
                total += float(line.rsplit(" ", 1)[1])
        return total

    def kill(self) -> None:
        """kill -9: no chance to flush or say goodbye."""
        self.process.kill()
        self.process.wait()

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.log.close()


@pytest.fixture(scope="session")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    running = Server(tmp_path_factory.mktemp("server") / "data")
    yield running
    running.stop()


@pytest.fixture
def client(server: Server) -> Iterator[tidemark.Client]:
    with tidemark.connect(server.url) as c:
        yield c


@pytest.fixture
def stream_name(request: pytest.FixtureRequest, client: tidemark.Client) -> Iterator[str]:
    """A stream name of the test's own, dropped after it."""
    name = "t_" + request.node.name.replace("[", "_").replace("]", "").replace("-", "_")[:60]
    yield name
    try:
        client.drop_stream(name)
    except tidemark.TidemarkError:
        pass
