#!/usr/bin/env python3
"""What one client can make the ingest paths hold with sparse, wide writes (issue 42, item 2).

Starts `tidemark serve` with a write token and a Graphite listener on a fresh directory, then
runs each attack for --seconds while sampling the server's RSS from /proc, and meanwhile
appends one ordinary event every second through the native API (the probe). Prints, per
attack, the peak RSS, what the attack's requests were answered, and the probe's failures and
slowest answer. The attacks are those the issue measured before the fix:

- line protocol: 5 MB bodies whose every line names one of 1,000 fields (the issue: 100 KB
  took the server to 306 MB RSS, 5 MB past 6 GB);
- remote write: series with 1,000 distinct label names (the issue: 365 KB took 3.1 GB);
- Graphite, no token: 48 connections sending lines whose tags name new fields without pause.

Stdlib only (remote write's snappy is written as literals, which every decoder reads);
loopback only; every loop ends by itself.

    python3 scripts/ingest-attacks.py --bin target/release/tidemark --seconds 60
"""

import argparse
import json
import os
import socket
import struct
import tempfile
import time
import urllib.error
import urllib.request

from attack_harness import count, free_port, run_attacks, start_server, stop_server

TOKEN = "attack-write-token-0123456789"
FIELDS = 1000


def post(url, body, content_type, headers=None, timeout=60):
    """The HTTP status of a POST (0: no answer)."""
    request = urllib.request.Request(url, data=body, method="POST")
    request.add_header("Content-Type", content_type)
    request.add_header("Authorization", f"Bearer {TOKEN}")
    for name, value in (headers or {}).items():
        request.add_header(name, value)
    try:
        with urllib.request.urlopen(request, timeout=timeout) as answer:
            answer.read()
            return answer.status
    except urllib.error.HTTPError as e:
        e.read()
        return e.code
    except OSError:
        return 0


# Each attack runs in a thread until `stop` is set.


def line_protocol(ports, stop, answers, size=5 << 20):
    """5 MB bodies, each line naming one of FIELDS fields."""
    url = f"http://127.0.0.1:{ports['http']}/api/v2/write?org=o&bucket=b"
    ts = time.time_ns()
    lines = []
    total = 0
    i = 0
    while total < size:
        line = f"wide f{i % FIELDS}=1 {ts + i}\n"
        lines.append(line)
        total += len(line)
        i += 1
    body = "".join(lines).encode()
    while not stop.is_set():
        count(answers, post(url, body, "text/plain"))


def varint(n):
    out = bytearray()
    while True:
        byte = n & 0x7F
        n >>= 7
        if n:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def field(number, wire_type, payload):
    key = varint(number << 3 | wire_type)
    if wire_type == 2:
        return key + varint(len(payload)) + payload
    return key + payload


def snappy_literal(data):
    """Snappy's block format with one literal element per 64 KiB: valid, not smaller."""
    out = bytearray(varint(len(data)))
    for at in range(0, len(data), 1 << 16):
        chunk = data[at : at + (1 << 16)]
        n = len(chunk) - 1
        if n < 60:
            out.append(n << 2)
        else:
            out.append(61 << 2)  # the length in the next two bytes
            out += struct.pack("<H", n)
        out += chunk
    return bytes(out)


def remote_write_body(series=1000):
    """Series of one metric, each with its own label name (FIELDS of them)."""
    now_ms = int(time.time() * 1000)
    request = bytearray()
    for i in range(series):
        labels = field(1, 2, field(1, 2, b"__name__") + field(2, 2, b"sparse_metric"))
        labels += field(1, 2, field(1, 2, b"l%d" % (i % FIELDS)) + field(2, 2, b"x"))
        sample = field(1, 1, struct.pack("<d", 1.0)) + field(2, 0, varint(now_ms))
        request += field(1, 2, labels + field(2, 2, sample))
    return snappy_literal(bytes(request))


def remote_write(ports, stop, answers):
    url = f"http://127.0.0.1:{ports['http']}/api/v1/write"
    body = remote_write_body()
    headers = {"Content-Encoding": "snappy", "X-Prometheus-Remote-Write-Version": "0.1.0"}
    while not stop.is_set():
        count(answers, post(url, body, "application/x-protobuf", headers))


def graphite(ports, stop, answers):
    """Lines whose tags name new fields (past graphite.max_fields they are bad lines)."""
    n = 0
    while not stop.is_set():
        try:
            with socket.create_connection(("127.0.0.1", ports["graphite"]), timeout=5) as sock:
                while not stop.is_set():
                    now = int(time.time())
                    batch = "".join(
                        f"p;t{(n + k) % FIELDS}=x 1 {now}\n" for k in range(1000)
                    ).encode()
                    n += 1000
                    sock.sendall(batch)
                    count(answers, "lines x1000")
        except OSError:
            count(answers, "reconnect")
            time.sleep(0.01)


ATTACKS = {
    "line protocol 5 MB x1000 fields x4": (line_protocol, 4),
    "remote write 1000 labels x4": (remote_write, 4),
    "graphite new tags, no token x48": (graphite, 48),
}


def probe(ports, stop, results):
    url = f"http://127.0.0.1:{ports['http']}/v1/streams/probe/events"
    while not stop.is_set():
        started = time.monotonic()
        body = json.dumps({"tstart": time.time_ns(), "V": 1}).encode()
        status = post(url, body, "application/x-ndjson", timeout=30)
        if status == 200:
            results["ok"] += 1
            results["slowest"] = max(results["slowest"], time.monotonic() - started)
        else:
            results["failed"] += 1
            results["last_error"] = f"HTTP {status}"
        time.sleep(1)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bin", default="target/release/tidemark")
    parser.add_argument("--seconds", type=float, default=60)
    parser.add_argument("--only", default="", help="run the attacks whose name contains this")
    parser.add_argument("--threads", type=int, default=0, help="threads per attack (0: each its own)")
    args = parser.parse_args()
    attacks = {
        name: (attack, args.threads or threads)
        for name, (attack, threads) in ATTACKS.items()
        if args.only in name
    }
    with tempfile.TemporaryDirectory() as dir:
        ports = {name: free_port() for name in ("http", "binary", "graphite")}
        config = os.path.join(dir, "tidemark.toml")
        with open(config, "w") as f:
            f.write(
                f'data_dir = "{dir}/data"\nhttp = "127.0.0.1:{ports["http"]}"\n'
                f'binary = "127.0.0.1:{ports["binary"]}"\n'
                f'[auth]\nwrite_token = "{TOKEN}"\nread_token = "{TOKEN}-read"\n'
                f'[graphite]\nlisten = "127.0.0.1:{ports["graphite"]}"\n'
            )
        server = start_server(args.bin, config, ports["http"])
        try:
            status = post(
                f"http://127.0.0.1:{ports['http']}/v1/streams",
                json.dumps({"name": "probe", "schema": "V:LONG"}).encode(),
                "application/json",
            )
            assert status in (200, 201), f"creating the probe's stream: HTTP {status}"
            run_attacks(server, attacks, probe, ports, args.seconds)
        finally:
            stop_server(server)


if __name__ == "__main__":
    main()
