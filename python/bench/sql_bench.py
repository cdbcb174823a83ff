"""The Python side of `tidemark bench sql` (workload `sql`): the queries analysts and
dashboards send, timed on Tidemark (over HTTP, answers as Arrow, through the `tidemark`
package) and on DuckDB in memory (answers as Arrow) over the same rows: `trades` and
`quotes`, as issue 46 measured them. The Rust command starts the server and reads the JSON
lines this prints, one per query and system:

    {"query": "newest_10", "system": "duckdb", "seconds": 0.0021, "rows": 10, "runs": 5}

Each query runs once on each system untimed (their row counts must agree), then `--repeat`
times on each in turn; the median is printed. A query slower than 10 s runs once.

Run by hand: python sql_bench.py --tidemark http://127.0.0.1:8080 [--trades 1000000]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import duckdb
import numpy as np
import pandas as pd

SYMBOLS = ["AAPL", "MSFT", "GOOG", "AMZN", "NVDA", "META", "TSLA", "BRK", "JPM", "V", "XOM",
           "UNH", "SAP", "ASML", "TSM", "NESN", "IBM", "ORCL", "INTC", "AMD"]
# 2026-03-30T09:00:00Z; trades 10 ms apart, quotes spread over the same span.
START_NS = 1_774_861_200 * 10**9
TRADE_SPACING_NS = 10_000_000
SLOW_SECONDS = 10.0


def frames(trades: int, quotes: int, seed: int) -> tuple[pd.DataFrame, pd.DataFrame]:
    rng = np.random.default_rng(seed)
    span = trades * TRADE_SPACING_NS
    trade_frame = pd.DataFrame({
        "tstart": START_NS + np.arange(trades, dtype=np.int64) * TRADE_SPACING_NS,
        "SYMBOL": rng.choice(SYMBOLS, trades),
        "PRICE": np.round(rng.random(trades) * 1000, 2),
        "QTY": rng.integers(1, 10_000, trades, dtype=np.int32),
    })
    # Whole microseconds: DuckDB's timestamps hold no finer.
    quote_times = np.sort(rng.integers(0, span // 1000, quotes, dtype=np.int64)) * 1000
    quote_frame = pd.DataFrame({
        "tstart": START_NS + quote_times,
        "SYMBOL": rng.choice(SYMBOLS, quotes),
        "BID": np.round(rng.random(quotes) * 1000, 2),
        "ASK": np.round(rng.random(quotes) * 1000 + 1, 2),
    })
    return trade_frame, quote_frame


def queries() -> list[tuple[str, str, str]]:
    """(name, Tidemark's text, DuckDB's text): issue 21's table of what analysts and
    dashboards send, and the shapes issue 46 found slow."""
    minute = 60 * 10**9
    in_range = (f"ts BETWEEN '{iso(START_NS + 10 * minute)}' "
                f"AND '{iso(START_NS + 70 * minute)}'")
    asof_end = iso(START_NS + 5 * minute)
    pairs = [
        ("group_by_symbol", "SELECT symbol, count(*), avg(price) FROM trades GROUP BY symbol"),
        ("newest_10", "SELECT ts, symbol, price FROM trades ORDER BY ts DESC LIMIT 10"),
        ("newest_10_of_a_symbol",
         "SELECT ts, price FROM trades WHERE symbol = 'MSFT' ORDER BY ts DESC LIMIT 10"),
        ("in_and_between",
         "SELECT count(*) FROM trades WHERE symbol IN ('AAPL', 'MSFT') "
         "AND qty BETWEEN 100 AND 2000"),
        ("or", "SELECT count(*) FROM trades WHERE symbol = 'IBM' OR qty < 10"),
        ("like", "SELECT count(*) FROM trades WHERE symbol LIKE 'A%'"),
        ("having",
         "SELECT symbol, count(*) AS c FROM trades GROUP BY symbol HAVING count(*) > 500 "
         "ORDER BY symbol"),
        ("offset", "SELECT ts, qty * 2 FROM trades ORDER BY ts LIMIT 5 OFFSET 100"),
        ("count_distinct", "SELECT count(DISTINCT symbol) FROM trades"),
        ("order_by_aggregate",
         "SELECT symbol, sum(qty) AS total FROM trades GROUP BY symbol ORDER BY total DESC"),
        ("top_3_by_a_field", "SELECT qty FROM trades ORDER BY qty DESC, ts LIMIT 3"),
        ("join_on_time",
         "SELECT count(*) FROM trades t JOIN quotes q ON t.symbol = q.symbol AND t.ts = q.ts"),
        ("exists",
         "SELECT count(*) FROM trades t WHERE EXISTS "
         "(SELECT 1 FROM quotes q WHERE q.symbol = t.symbol AND q.bid > 800)"),
        ("not_in",
         "SELECT count(*) FROM trades WHERE symbol NOT IN "
         "(SELECT symbol FROM quotes WHERE bid > 999.9)"),
        ("as_of_join_5_minutes",
         "SELECT ts, symbol, bid FROM (SELECT t.ts, t.symbol, q.bid, row_number() OVER "
         "(PARTITION BY t.ts, t.symbol ORDER BY q.ts DESC) AS r FROM trades t "
         "LEFT JOIN quotes q ON q.symbol = t.symbol AND q.ts <= t.ts "
         f"WHERE t.ts < '{asof_end}') WHERE r = 1 ORDER BY ts LIMIT 50"),
        ("date_trunc_hour",
         "SELECT date_trunc('hour', ts) AS h, count(*) FROM trades GROUP BY h ORDER BY h"),
        ("extract_minute", "SELECT extract(minute FROM ts), count(*) FROM trades GROUP BY 1"),
        ("min_max_ts", "SELECT min(ts), max(ts) FROM trades"),
        ("lag",
         "SELECT ts, qty - lag(qty) OVER (PARTITION BY symbol ORDER BY ts) FROM trades "
         "ORDER BY ts LIMIT 40"),
        ("first_two_per_symbol",
         "SELECT symbol, ts FROM (SELECT symbol, ts, row_number() OVER "
         "(PARTITION BY symbol ORDER BY ts) AS r FROM trades) WHERE r <= 2 "
         "ORDER BY symbol, ts"),
        ("cte_and_scalar_subquery",
         "WITH big AS (SELECT * FROM trades WHERE qty > 5000) "
         "SELECT count(*) FROM big WHERE qty > (SELECT avg(qty) FROM trades)"),
        ("grafana_time_range", f"SELECT count(*) FROM trades WHERE {in_range}"),
        ("a_symbol_no_block_holds", "SELECT count(*) FROM trades WHERE symbol = 'aapl'"),
    ]
    bucketed = [
        ("bucket_15_minutes_newest",
         "SELECT time_bucket('15 minutes', ts) AS b, max(qty) FROM trades GROUP BY b "
         "ORDER BY b DESC LIMIT 5",
         "SELECT time_bucket(INTERVAL '15 minutes', ts) AS b, max(qty) FROM trades "
         "GROUP BY b ORDER BY b DESC LIMIT 5"),
        ("grafana_per_minute",
         f"SELECT time_bucket('1 minute', ts) AS time, avg(price) FROM trades "
         f"WHERE {in_range} GROUP BY 1 ORDER BY 1",
         f"SELECT time_bucket(INTERVAL '1 minute', ts) AS time, avg(price) FROM trades "
         f"WHERE {in_range} GROUP BY 1 ORDER BY 1"),
    ]
    return [(name, text, text) for name, text in pairs] + bucketed


def iso(ns: int) -> str:
    return pd.Timestamp(ns, unit="ns", tz="UTC").strftime("%Y-%m-%dT%H:%M:%SZ")


def load_duckdb(trades: pd.DataFrame, quotes: pd.DataFrame) -> duckdb.DuckDBPyConnection:
    duck = duckdb.connect()
    duck.execute("SET TimeZone = 'UTC'")
    for name, frame in [("trades", trades), ("quotes", quotes)]:
        duck.register(f"{name}_frame", frame)
        columns = ", ".join(c.lower() for c in frame.columns if c != "tstart")
        duck.execute(
            f"CREATE TABLE {name} AS SELECT make_timestamp(tstart // 1000)::TIMESTAMPTZ AS ts, "
            f"{columns} FROM {name}_frame ORDER BY tstart"
        )
        duck.unregister(f"{name}_frame")
    return duck


def load_tidemark(url: str, token: str | None, trades: pd.DataFrame, quotes: pd.DataFrame):
    import tidemark

    client = tidemark.connect(url, token=token, timeout=600)
    client.create_stream("trades", {"SYMBOL": "STRING", "PRICE": "DOUBLE", "QTY": "INTEGER"})
    client.create_stream("quotes", {"SYMBOL": "STRING", "BID": "DOUBLE", "ASK": "DOUBLE"})
    for name, frame in [("trades", trades), ("quotes", quotes)]:
        stored = client.append(name, frame)
        if stored != len(frame):
            sys.exit(f"tidemark: {stored} of {len(frame)} {name} stored")
    return client


def timed(run) -> tuple[float, int]:
    started = time.perf_counter()
    rows = run()
    return time.perf_counter() - started, rows


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tidemark", required=True)
    parser.add_argument("--token")
    parser.add_argument("--trades", type=int, default=1_000_000)
    parser.add_argument("--quotes", type=int, default=200_000)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--only", help="run only the queries whose names contain this")
    args = parser.parse_args()
    trades, quotes = frames(args.trades, args.quotes, seed=46)
    duck = load_duckdb(trades, quotes)
    client = load_tidemark(args.tidemark, args.token, trades, quotes)
    del trades, quotes
    for name, ours, theirs in queries():
        if args.only and args.only not in name:
            continue
        systems = {
            "tidemark": lambda q=ours: client.query_arrow(q).num_rows,
            "duckdb": lambda q=theirs: duck.execute(q).to_arrow_table().num_rows,
        }
        first = {system: timed(run) for system, run in systems.items()}
        rows = {system: r for system, (_, r) in first.items()}
        if rows["tidemark"] != rows["duckdb"]:
            sys.exit(f"{name}: Tidemark answered {rows['tidemark']} rows, DuckDB "
                     f"{rows['duckdb']}: {ours}")
        slow = max(seconds for seconds, _ in first.values()) > SLOW_SECONDS
        times = {system: [seconds] for system, (seconds, _) in first.items()} if slow else {
            system: [] for system in systems}
        for _ in range(0 if slow else args.repeat):
            for system, run in systems.items():
                times[system].append(timed(run)[0])
        for system, seconds in times.items():
            print(json.dumps({"query": name, "system": system,
                              "seconds": statistics.median(seconds),
                              "rows": rows[system], "runs": len(seconds)}), flush=True)
    client.close()


if __name__ == "__main__":
    main()
