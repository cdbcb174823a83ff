#!/usr/bin/env python3
"""How a log's fsyncs fare beside segment writes on this machine's disk: the experiment
behind the paced checkpoint writes (crates/tidemark-storage/src/pace.rs, docs/benchmarks.md
W5 "Where the live p99 went").

A *log* thread appends 64 KiB with an fdatasync each, at a fixed rate (W5's: half the disk's
limit), and reports its latency from each write's due time (p50 / p99 / p99.9 / max ms).
Beside it, a *segment* thread writes a 64 MiB file each time the log has taken 64 MiB (as
a checkpoint flushes a full memtable), each fsync'd at its end, in one of three ways:

    none    no segment writes: the disk's own floor
    burst   each file written as fast as the page cache takes it (writeback started every
            1 MiB), then fsync'd: what a checkpoint did before its writes were paced
    paced   each 1 MiB step's writeback started at once and the steps spaced evenly at
            --segment-mb-s (twice the log's rate: what a checkpoint does now)

The segment files are kept until the run ends, as a checkpoint keeps its segments, or
deleted right after each is written (--delete), as compaction deletes what it replaced and
a log releases its files:

    unlink  at once (freeing 64 MiB of blocks, which on this machine, an ext4 mounted with
            `discard`, put a paced run's log fsync p99 of ~6 ms back up to ~40–50 ms)
    steps   cut to nothing in 1 MiB steps (ftruncate) spaced at --segment-mb-s, then
            unlinked: the blocks freed, and discarded, a step at a time

    python3 scripts/fsync-beside-segments.py [--log-mb-s 46] [--segment-mb-s 92] [--seconds 10]
        [--delete keep|unlink|steps] [--modes none,burst,paced] [DIR]

Each mode runs twice, alternating (the disk of a shared VM drifts). Linux only (it calls
sync_file_range through ctypes).
"""

from __future__ import annotations

import argparse
import ctypes
import os
import threading
import time

STEP = 1 << 20
SEGMENT = 64 << 20
LOG_WRITE = 64 << 10
SYNC_FILE_RANGE_WRITE = 2

libc = ctypes.CDLL("libc.so.6", use_errno=True)
libc.sync_file_range.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]


def log_latencies(directory: str, rate: float, seconds: float) -> list[float]:
    path = os.path.join(directory, f".log-{os.getpid()}")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    data = os.urandom(LOG_WRITE)
    interval = LOG_WRITE / rate
    latencies = []
    started = time.perf_counter()
    try:
        i = 0
        while time.perf_counter() - started < seconds:
            due = started + i * interval
            now = time.perf_counter()
            if now < due:
                time.sleep(due - now)
            os.write(fd, data)
            os.fdatasync(fd)
            latencies.append(time.perf_counter() - due)
            i += 1
    finally:
        os.close(fd)
        os.unlink(path)
    return latencies


def delete_in_steps(fd: int, rate: float) -> None:
    """Cuts the file `fd` to nothing a STEP at a time, the steps spaced at `rate`."""
    started = time.perf_counter()
    for step, size in enumerate(range(SEGMENT - STEP, -1, -STEP)):
        due = started + step * STEP / rate
        now = time.perf_counter()
        if now < due:
            time.sleep(due - now)
        os.ftruncate(fd, size)


def write_segments(
    directory: str, mode: str, fill_rate: float, rate: float, seconds: float, delete: str
) -> None:
    data = os.urandom(STEP)
    started = time.perf_counter()
    n = 0
    written = []
    while time.perf_counter() - started < seconds:
        file_due = started + (n + 1) * SEGMENT / fill_rate
        now = time.perf_counter()
        if now < file_due:
            time.sleep(file_due - now)
        path = os.path.join(directory, f".segment-{os.getpid()}-{n}")
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            for step in range(SEGMENT // STEP):
                if mode == "paced":
                    step_due = file_due + step * STEP / rate
                    now = time.perf_counter()
                    if now < step_due:
                        time.sleep(step_due - now)
                os.write(fd, data)
                libc.sync_file_range(fd, step * STEP, STEP, SYNC_FILE_RANGE_WRITE)
            os.fsync(fd)
            if delete == "steps":
                delete_in_steps(fd, rate)
        finally:
            os.close(fd)
            written.append(path)
            if delete != "keep":
                os.unlink(written.pop())
        n += 1
    for path in written:
        os.unlink(path)


def run(
    directory: str,
    mode: str,
    log_rate: float,
    segment_rate: float,
    seconds: float,
    delete: str = "keep",
) -> str:
    segments = None
    if mode != "none":
        segments = threading.Thread(
            target=write_segments,
            args=(directory, mode, log_rate, segment_rate, seconds, delete),
        )
        segments.start()
    latencies = sorted(log_latencies(directory, log_rate, seconds))
    if segments is not None:
        segments.join()
    n = len(latencies)

    def ms(q: float) -> str:
        return f"{latencies[min(n - 1, int(n * q))] * 1e3:.1f}"

    return f"{mode:6} {delete:6} log {n} fsyncs  p50 {ms(0.5)}  p99 {ms(0.99)}  p99.9 {ms(0.999)}  max {latencies[-1] * 1e3:.1f} ms"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("directory", nargs="?", default=".")
    parser.add_argument("--log-mb-s", type=float, default=46.0)
    parser.add_argument("--segment-mb-s", type=float, default=92.0)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--delete", default="keep", choices=("keep", "unlink", "steps"))
    parser.add_argument("--modes", default="none,burst,paced")
    args = parser.parse_args()
    for _ in range(2):
        for mode in args.modes.split(","):
            print(
                run(
                    args.directory,
                    mode,
                    args.log_mb_s * 1e6,
                    args.segment_mb_s * 1e6,
                    args.seconds,
                    args.delete,
                ),
                flush=True,
            )
            time.sleep(2)


if __name__ == "__main__":
    main()
