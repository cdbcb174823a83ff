#!/usr/bin/env python3
"""fdatasync latency of this machine's disk for log-sized writes, two ways: appending to a
growing file (what a new log file gets: every fdatasync also writes the file's new size, and
on a file system with a journal commits it there, a commit the fsyncs of every other file
share) and overwriting blocks the file already has (what a reused log file gets, docs/
ARCHITECTURE.md "Log files are reused": no metadata changes). Prints p50 / p90 / p99 /
p99.9 in ms for each, twice.

    python3 scripts/fsync-latency.py [DIR]      # DIR: a directory on the disk to measure (.)

The numbers behind docs/benchmarks.md W4's note on produce → agent-ack p99. Each round
writes 3,000 records of 45 KiB (about a group commit of the agent under W4) and deletes its
file afterwards; the overwritten file is zero-filled first (its old contents do not matter).
"""

from __future__ import annotations

import os
import sys
import time

RECORDS = 3000
RECORD_BYTES = 45 << 10


def latencies(directory: str, overwrite: bool) -> list[float]:
    path = os.path.join(directory, f".fsync-latency-{os.getpid()}")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        if overwrite:
            zeros = bytes(1 << 20)
            for _ in range(RECORDS * RECORD_BYTES // len(zeros) + 1):
                os.write(fd, zeros)
            os.fsync(fd)
            os.lseek(fd, 0, os.SEEK_SET)
        record = os.urandom(RECORD_BYTES)
        taken = []
        for _ in range(RECORDS):
            os.write(fd, record)
            started = time.perf_counter()
            os.fdatasync(fd)
            taken.append((time.perf_counter() - started) * 1e3)
        return sorted(taken)
    finally:
        os.close(fd)
        os.unlink(path)


def main() -> None:
    directory = sys.argv[1] if len(sys.argv) > 1 else "."
    for _ in range(2):
        for overwrite, label in ((False, "appending"), (True, "overwriting")):
            taken = latencies(directory, overwrite)
            quantiles = " / ".join(
                f"{taken[min(int(q * len(taken)), len(taken) - 1)]:.2f}"
                for q in (0.5, 0.9, 0.99, 0.999)
            )
            print(f"{label}: fdatasync p50 / p90 / p99 / p99.9 {quantiles} ms")


if __name__ == "__main__":
    main()
