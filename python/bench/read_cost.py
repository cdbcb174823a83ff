"""What reading an answer costs the Python client, for docs/benchmarks.md `python`: wall
time, this process's CPU time and minor page faults per `query_arrow`, then per
`to_pandas` of its table.

    .venv/bin/python python/bench/read_cost.py http://127.0.0.1:8080 "SELECT * FROM demo_event_store"

(the stream as `bench python` leaves it: `python python/bench/python_bench.py --tidemark URL
--trials 1` fills it). The first reads of a process pay for memory touched the first time.
"""

from __future__ import annotations

import argparse
import resource
import time

import pandas  # noqa: F401 -- imported before anything is timed
import tidemark
from tidemark.client import _to_pandas


def usage() -> tuple[float, float, int]:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return time.perf_counter(), r.ru_utime + r.ru_stime, r.ru_minflt


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("url")
    parser.add_argument("sql")
    parser.add_argument("--reads", type=int, default=6)
    args = parser.parse_args()
    with tidemark.connect(args.url, timeout=600) as client:
        for read in range(1, args.reads + 1):
            wall0, cpu0, faults0 = usage()
            table = client.query_arrow(args.sql)
            wall1, cpu1, faults1 = usage()
            frame = _to_pandas(table)
            wall2, cpu2, faults2 = usage()
            print(f"read {read}: {table.num_rows} rows; Arrow {wall1 - wall0:.3f} s wall, "
                  f"{cpu1 - cpu0:.3f} s CPU, {faults1 - faults0} faults; to_pandas "
                  f"{wall2 - wall1:.3f} s wall, {cpu2 - cpu1:.3f} s CPU, {faults2 - faults1} faults")
            del table, frame


if __name__ == "__main__":
    main()
