#!/usr/bin/env python3
"""What one hostile client can make the PostgreSQL listener hold (issue 42, item 1 and 6).

Starts `tidemark serve --pg` with a read token on a fresh directory, then runs each attack
for --seconds while sampling the server's RSS from /proc, and meanwhile opens a session with
the right password every second and runs `SELECT 1` (the probe). Prints, per attack, the
peak RSS and the probe's failures and slowest answer. Stdlib only; loopback only; every
loop ends by itself.

    python3 scripts/pg-attacks.py --bin target/release/tidemark --seconds 60
"""

import argparse
import os
import socket
import struct
import tempfile
import time

from attack_harness import free_port, run_attacks, start_server, stop_server

TOKEN = "attack-read-token-0123456789"


def startup():
    body = struct.pack("!i", 196608) + b"user\0x\0database\0tidemark\0\0"
    return struct.pack("!i", len(body) + 4) + body


def message(kind, body):
    return kind + struct.pack("!i", len(body) + 4) + body


def read_message(sock):
    head = b""
    while len(head) < 5:
        chunk = sock.recv(5 - len(head))
        if not chunk:
            return None
        head += chunk
    length = struct.unpack("!i", head[1:5])[0] - 4
    body = b""
    while len(body) < length:
        chunk = sock.recv(min(65536, length - len(body)))
        if not chunk:
            return None
        body += chunk
    return head[:1], body


def session(port, timeout=10.0):
    """A connection authenticated with the token, ready for queries."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    sock.sendall(startup())
    kind, _ = read_message(sock) or (None, None)
    if kind != b"R":
        raise RuntimeError(f"no password request: {kind}")
    sock.sendall(message(b"p", TOKEN.encode() + b"\0"))
    while True:
        got = read_message(sock)
        if got is None:
            raise RuntimeError("closed during authentication")
        if got[0] == b"E":
            raise RuntimeError(got[1][:200])
        if got[0] == b"Z":
            return sock


def until_ready(sock):
    while True:
        got = read_message(sock)
        if got is None or got[0] == b"Z":
            return got


# Each attack runs in a thread until `stop` is set.


def pre_auth_gigabyte(port, stop, _answers):
    """A query claiming 1 GiB before the password, its bytes streamed."""
    junk = b"x" * (1 << 20)
    while not stop.is_set():
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
                sock.sendall(startup())
                read_message(sock)
                sock.sendall(b"Q\x3f\xff\xff\xff")
                while not stop.is_set():
                    sock.sendall(junk)
        except OSError:
            time.sleep(0.01)


def silent_starters(port, stop, _answers, count=100):
    """Connections that send their startup message and nothing more."""
    socks = []
    while not stop.is_set():
        try:
            sock = socket.create_connection(("127.0.0.1", port), timeout=5)
            sock.sendall(startup())
            socks.append(sock)
        except OSError:
            time.sleep(0.01)
        if len(socks) >= count:
            socks.pop(0).close()
    for s in socks:
        s.close()


def largest_messages(port, stop, _answers, size=16 << 20):
    """Sessions sending statements of the largest size a message may have."""
    sql = b"SELECT length('" + b"x" * (size - 64) + b"')\0"
    while not stop.is_set():
        try:
            with session(port) as sock:
                while not stop.is_set():
                    sock.sendall(message(b"Q", sql))
                    until_ready(sock)
        except (OSError, RuntimeError):
            time.sleep(0.01)


def prepared_flood(port, stop, _answers, size=1 << 20):
    """Sessions preparing named statements of 1 MiB until refused, then holding them."""
    sql = b"SELECT '" + b"x" * size + b"'"
    while not stop.is_set():
        try:
            with session(port) as sock:
                for i in range(100_000):
                    if stop.is_set():
                        return
                    sock.sendall(message(b"P", b"s%d\0" % i + sql + b"\0\0\0"))
                    sock.sendall(message(b"S", b""))
                    until_ready(sock)
        except (OSError, RuntimeError):
            time.sleep(0.01)


ATTACKS = {
    "pre-auth 1 GiB query x16": (pre_auth_gigabyte, 16),
    "silent starters x4 (100 each)": (silent_starters, 4),
    "16 MiB statements x32": (largest_messages, 32),
    "1 MiB prepared statements x16": (prepared_flood, 16),
}


def probe(port, stop, results):
    while not stop.is_set():
        started = time.monotonic()
        try:
            with session(port) as sock:
                sock.sendall(message(b"Q", b"SELECT 1\0"))
                until_ready(sock)
            results["slowest"] = max(results["slowest"], time.monotonic() - started)
            results["ok"] += 1
        except (OSError, RuntimeError) as e:
            results["failed"] += 1
            results["last_error"] = str(e)[:120]
        time.sleep(1)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bin", default="target/release/tidemark")
    parser.add_argument("--seconds", type=float, default=60)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as dir:
        pg, http, binary = free_port(), free_port(), free_port()
        config = os.path.join(dir, "tidemark.toml")
        with open(config, "w") as f:
            f.write(
                f'data_dir = "{dir}/data"\nhttp = "127.0.0.1:{http}"\nbinary = "127.0.0.1:{binary}"\n'
                f'[auth]\nread_token = "{TOKEN}"\n[pg]\nlisten = "127.0.0.1:{pg}"\n'
            )
        server = start_server(args.bin, config, http)
        try:
            run_attacks(server, ATTACKS, probe, pg, args.seconds)
        finally:
            stop_server(server)


if __name__ == "__main__":
    main()
