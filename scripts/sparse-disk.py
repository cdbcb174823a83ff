#!/usr/bin/env python3
"""Bytes on disk of a sparse, wide stream (issue 42): a fresh server takes --bodies line-protocol
bodies of 160,000 lines, each naming one of 1,000 fields, is stopped gracefully (which flushes),
and the segments' bytes are counted.

    python3 scripts/sparse-disk.py --bin target/debug/tidemark
"""

import argparse
import os
import tempfile
import time
import urllib.request

from attack_harness import free_port, start_server, stop_server


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bin", default="target/release/tidemark")
    parser.add_argument("--bodies", type=int, default=20)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as dir:
        port = free_port()
        config = os.path.join(dir, "tidemark.toml")
        with open(config, "w") as f:
            f.write(
                f'data_dir = "{dir}/data"\nhttp = "127.0.0.1:{port}"\n'
                f'binary = "127.0.0.1:{free_port()}"\n'
            )
        server = start_server(args.bin, config, port)
        ts, events = time.time_ns(), 0
        try:
            for _ in range(args.bodies):
                lines = []
                for _ in range(160_000):
                    lines.append(f"wide f{events % 1000}=1 {ts + events}\n")
                    events += 1
                body = "".join(lines).encode()
                url = f"http://127.0.0.1:{port}/api/v2/write?org=o&bucket=b"
                urllib.request.urlopen(urllib.request.Request(url, data=body), timeout=120).read()
        finally:
            stop_server(server)
        segments = os.path.join(dir, "data", "segments")
        size = sum(os.path.getsize(os.path.join(segments, f)) for f in os.listdir(segments))
        print(f"{events} events: segments {size / 1e6:.1f} MB, {size * 8 / events:.1f} bits per event")


if __name__ == "__main__":
    main()
