"""S3Proxy's own speed with another client (boto3), for docs/benchmarks.md `tier`: what a
PUT of a segment-sized object and a ranged GET cost when Tidemark is not the client.

    peers/install.sh s3proxy && .venv/bin/pip install boto3
    .venv/bin/python peers/s3proxy/get_latency.py

Starts S3Proxy (filesystem backend, SigV4 checked) on a free port over a temporary
directory, warms its JVM up, then prints: PUT of 5 MiB (ms, MB/s, S3Proxy's CPU per PUT;
boto3 signs the body over plain HTTP), ranged GETs of 1 MiB and 1 KB on a reused connection,
the first three 1 MiB ranges of objects read 1 s after their PUT, and S3Proxy's CPU per PUT
of unsigned bodies over 250 PUTs (its JVM compiles for that long). Stops S3Proxy at the end.
"""

from __future__ import annotations

import os
import socket
import statistics
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import boto3
from botocore.config import Config

REPO = Path(__file__).resolve().parents[2]
BUCKET = "bench"
OBJECT = 5 << 20
MIB = 1 << 20


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start(directory: Path) -> tuple[subprocess.Popen[bytes], str]:
    libs = REPO / ".peers" / "s3proxy" / "libs"
    if not libs.is_dir():
        raise SystemExit(f"S3Proxy is not installed ({libs}): peers/install.sh s3proxy")
    endpoint = f"http://127.0.0.1:{free_port()}"
    (directory / "data" / BUCKET).mkdir(parents=True)
    config = directory / "s3proxy.conf"
    config.write_text(
        f"s3proxy.endpoint={endpoint}\ns3proxy.authorization=aws-v2-or-v4\n"
        "s3proxy.identity=bench\ns3proxy.credential=secret\njclouds.provider=filesystem\n"
        f"jclouds.filesystem.basedir={directory / 'data'}\n"
    )
    process = subprocess.Popen(
        ["java", f"-Dlogback.configurationFile={REPO / 'peers' / 's3proxy' / 'logback.xml'}",
         "-cp", f"{libs}/*", "org.gaul.s3proxy.Main", "--properties", str(config)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            urllib.request.urlopen(endpoint, timeout=1)
            break
        except urllib.error.HTTPError:
            break  # It answers (403 without a signature): it is up.
        except OSError:
            time.sleep(0.2)
    else:
        process.kill()
        raise SystemExit("S3Proxy did not start in 60 s")
    return process, endpoint


def cpu_seconds(pid: int) -> float:
    """User and system CPU time of process `pid` so far (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def ms(action: object) -> float:
    started = time.perf_counter()
    action()  # type: ignore[operator]
    return (time.perf_counter() - started) * 1e3


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        process, endpoint = start(Path(tmp))
        try:
            s3 = boto3.client(
                "s3", endpoint_url=endpoint, aws_access_key_id="bench",
                aws_secret_access_key="secret", region_name="us-east-1",
                config=Config(s3={"addressing_style": "path"}),
            )
            body = os.urandom(OBJECT)

            def put(key: str) -> None:
                s3.put_object(Bucket=BUCKET, Key=key, Body=body)

            def get(key: str, first: int, size: int) -> None:
                rng = f"bytes={first}-{first + size - 1}"
                s3.get_object(Bucket=BUCKET, Key=key, Range=rng)["Body"].read()

            for i in range(20):  # the JVM's first requests are many times slower
                put(f"warm-{i % 4}")
                get(f"warm-{i % 4}", 0, MIB)
            cpu_before = cpu_seconds(process.pid)
            puts = [ms(lambda i=i: put(f"object-{i}")) for i in range(10)]
            put_cpu_ms = (cpu_seconds(process.pid) - cpu_before) / len(puts) * 1e3
            mib = [ms(lambda: get("object-0", MIB, MIB)) for _ in range(10)]
            kb = [ms(lambda: get("object-0", MIB, 1000)) for _ in range(10)]
            print(f"PUT 5 MiB: median {statistics.median(puts):.1f} ms, "
                  f"{OBJECT / 1e6 / (statistics.median(puts) / 1e3):.1f} MB/s; "
                  f"S3Proxy's CPU: {put_cpu_ms:.1f} ms per PUT")
            print(f"ranged GET 1 MiB: median {statistics.median(mib):.1f} ms; "
                  f"1 KB: median {statistics.median(kb):.1f} ms")
            for i in range(5):
                put(f"fresh-{i}")
                time.sleep(1.0)
                firsts = [ms(lambda k=k: get(f"fresh-{i}", k * MIB, MIB)) for k in range(3)]
                print("fresh object, its 1st, 2nd, 3rd 1 MiB range: "
                      + ", ".join(f"{t:.1f}" for t in firsts) + " ms")
            # Bodies not signed (as Tidemark sends them), and how S3Proxy's CPU per PUT
            # falls while its JVM keeps compiling: 250 PUTs, two at a time.
            unsigned = boto3.client(
                "s3", endpoint_url=endpoint, aws_access_key_id="bench",
                aws_secret_access_key="secret", region_name="us-east-1",
                config=Config(max_pool_connections=2, s3={
                    "addressing_style": "path", "payload_signing_enabled": False}),
            )
            with ThreadPoolExecutor(2) as pool:
                for first in range(0, 250, 50):
                    before = cpu_seconds(process.pid)
                    list(pool.map(
                        lambda i: unsigned.put_object(Bucket=BUCKET, Key=f"u-{i % 8}", Body=body),
                        range(first, first + 50),
                    ))
                    per_put = (cpu_seconds(process.pid) - before) / 50 * 1e3
                    print(f"unsigned PUTs {first + 1}-{first + 50}, two at a time: "
                          f"S3Proxy's CPU {per_put:.1f} ms per PUT")
        finally:
            process.kill()
            process.wait()


if __name__ == "__main__":
    main()
