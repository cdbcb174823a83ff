"""The Python side of `tidemark bench python` (workload `python`): a W1 DataFrame appended
durably and read back into pandas through the `tidemark` package, and the same DataFrame
into QuestDB through its own client (`questdb` 6.x, line protocol over HTTP from a
DataFrame). The Rust command starts the servers and reads the JSON lines this prints:

    {"system": "tidemark", "phase": "append", "trial": 1, "rows": 10000000, "seconds": 1.9}

Run by hand: python python_bench.py --tidemark http://127.0.0.1:8080 [--questdb 127.0.0.1:9000]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import urllib.parse
import urllib.request

import numpy as np
import pandas as pd

STREAM = "demo_event_store"
SCHEMA = {"SYMBOL": "STRING", "SECURITYTYPE": "INTEGER", "LASTTRADEPRICE": "FLOAT"}
# The frame's own columns: `SELECT *` would add `tend`, which W1's events do not have (all
# null: a quarter of the answer's bytes and an array of NaT in pandas).
READ_BACK = f"SELECT tstart, SYMBOL, SECURITYTYPE, LASTTRADEPRICE FROM {STREAM}"
SYMBOLS = ["AAPL", "MSFT", "GOOG", "AMZN", "NVDA", "META", "TSLA", "BRK", "JPM", "V", "XOM",
           "UNH", "SAP", "ASML", "TSM", "NESN"]
SPACING_NS = 100_000  # W1: events 0.1 ms apart


def w1_frame(rows: int, seed: int) -> pd.DataFrame:
    """W1's events as analysts hold them: the symbol a categorical, times in nanoseconds
    ending now."""
    rng = np.random.default_rng(seed)
    end = time.time_ns()
    return pd.DataFrame({
        "tstart": end - (rows - 1) * SPACING_NS + np.arange(rows, dtype=np.int64) * SPACING_NS,
        "SYMBOL": pd.Categorical.from_codes(rng.integers(0, len(SYMBOLS), rows), SYMBOLS),
        "SECURITYTYPE": rng.integers(0, 8, rows, dtype=np.int32),
        "LASTTRADEPRICE": np.round(rng.random(rows, dtype=np.float32) * 500, 2),
    })


def emit(system: str, phase: str, trial: int, rows: int, seconds: float) -> None:
    print(json.dumps({"system": system, "phase": phase, "trial": trial, "rows": rows,
                      "seconds": seconds}), flush=True)


def tidemark_trials(url: str, token: str | None, frame: pd.DataFrame, trials: int) -> None:
    import tidemark

    rows = len(frame)
    with tidemark.connect(url, token=token, timeout=600) as client:
        client.create_stream(STREAM, SCHEMA)
        for trial in range(1, trials + 1):
            client.clear(STREAM)
            started = time.perf_counter()
            stored = client.append(STREAM, frame)
            emit("tidemark", "append", trial, rows, time.perf_counter() - started)
            if stored != rows:
                sys.exit(f"tidemark: {stored} of {rows} rows stored")
            started = time.perf_counter()
            back = client.query(READ_BACK)
            emit("tidemark", "read_pandas", trial, len(back), time.perf_counter() - started)
            started = time.perf_counter()
            table = client.query_arrow(READ_BACK)
            emit("tidemark", "read_arrow", trial, table.num_rows, time.perf_counter() - started)
            if len(back) != rows or table.num_rows != rows:
                sys.exit(f"tidemark: {len(back)} and {table.num_rows} rows read back of {rows}")
            if trial == trials:
                check_read_back(frame, back)
            del back, table


def check_read_back(frame: pd.DataFrame, back: pd.DataFrame) -> None:
    """The frame read back is the frame appended (untimed)."""
    same = (
        np.array_equal(back["tstart"].array.asi8, frame["tstart"].to_numpy())
        and np.array_equal(back["SECURITYTYPE"].to_numpy(np.int32), frame["SECURITYTYPE"])
        and np.array_equal(back["LASTTRADEPRICE"].to_numpy(), frame["LASTTRADEPRICE"])
        and back["SYMBOL"].value_counts().to_dict()
        == frame["SYMBOL"].astype(str).value_counts().to_dict()
    )
    if not same:
        sys.exit("tidemark: the frame read back differs from the frame appended")


def questdb_count(http: str, table: str) -> int:
    query = urllib.parse.quote(f"select count() from '{table}'")
    with urllib.request.urlopen(f"http://{http}/exec?query={query}", timeout=30) as answer:
        return int(json.loads(answer.read())["dataset"][0][0])


def questdb_trials(http: str, frame: pd.DataFrame, trials: int) -> None:
    import questdb

    rows = len(frame)
    # QuestDB's client takes the designated timestamp as a datetime column.
    frame = frame.assign(tstart=pd.to_datetime(frame["tstart"], unit="ns", utc=True))
    for trial in range(1, trials + 1):
        table = f"w1_python_{trial}"
        started = time.perf_counter()
        with questdb.Sender.from_conf(f"http::addr={http};") as sender:
            sender.dataframe(frame, table_name=table, symbols=["SYMBOL"], at="tstart")
            sender.flush()
        emit("questdb", "append", trial, rows, time.perf_counter() - started)
        # Acknowledged is committed; visible comes once QuestDB applied its WAL (untimed).
        deadline = time.monotonic() + 120
        while questdb_count(http, table) < rows and time.monotonic() < deadline:
            time.sleep(0.05)
        held = questdb_count(http, table)
        if held != rows:
            sys.exit(f"questdb: {rows} rows acknowledged, {held} held")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tidemark", help="a Tidemark server's URL")
    parser.add_argument("--token", help="its write token, if it has one")
    parser.add_argument("--questdb", help="a QuestDB server's HTTP address, host:port")
    parser.add_argument("--rows", type=int, default=10_000_000)
    parser.add_argument("--trials", type=int, default=3)
    args = parser.parse_args()
    frame = w1_frame(args.rows, seed=42)
    if args.tidemark:
        tidemark_trials(args.tidemark, args.token, frame, args.trials)
    if args.questdb:
        questdb_trials(args.questdb, frame, args.trials)


if __name__ == "__main__":
    main()
