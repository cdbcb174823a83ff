"""Tidemark's SQL answers against DuckDB's for the same rows.

Run by `crates/tidemark-server/tests/reference.rs`, which starts a server and passes its URL:

    python compare_with_duckdb.py http://127.0.0.1:PORT

It creates three streams over HTTP (`ticks` with nulls, NaN and infinities in its fields,
`quotes` to join with, `idle` with no events), appends generated events, loads the same rows
into DuckDB (set to PostgreSQL's NULL order and UTC), then runs a corpus of queries on both:
issue 21's table of the queries analysts and dashboards send, and generated filters, groups,
orders, limits, windows, joins and time-zone arithmetic. Answers are compared value by value
(floats to 1e-9 relative; NaN equals NaN; timestamps as nanoseconds), in order where the
query orders its rows and as multisets where it does not. It prints each difference and
closes with `N passed, M failed`; it exits 1 if any query failed.
"""

import datetime
import decimal
import json
import math
import random
import re
import sys
import urllib.error
import urllib.request

import duckdb

SEED = 21
EPOCH = datetime.datetime(1970, 1, 1, tzinfo=datetime.timezone.utc)
# 2026-03-28T22:00:00Z: the events run across the night Europe's clocks went forward
# (2026-03-29 01:00 UTC), so local-time arithmetic in time zones has an edge to get wrong.
START_NS = 1_774_735_200 * 10**9
SYMBOLS = ["AAPL", "MSFT", "BRK.B", "ABC", "abc"]


def main():
    url = sys.argv[1].rstrip("/")
    ticks, quotes = generate_rows(random.Random(SEED))
    load_tidemark(url, ticks, quotes)
    duck = load_duckdb(ticks, quotes)
    corpus = fixed_queries() + generated_queries(random.Random(SEED + 1))
    assert len(corpus) >= 100, f"the corpus has {len(corpus)} queries, fewer than 100"
    passed, failed = 0, 0
    for number, (tidemark_sql, duckdb_sql, ordered) in enumerate(corpus, 1):
        # The second time, the server answers from the plan it kept of the statement.
        for time in ["", " (planned before)"]:
            problem = compare(url, duck, tidemark_sql, duckdb_sql, ordered)
            if problem is None:
                passed += 1
            else:
                failed += 1
                print(f"query {number}{time} differs: {tidemark_sql}\n  {problem}\n", flush=True)
    refusals_failed = check_refusals(url)
    failed += refusals_failed
    passed += len(REFUSALS) - refusals_failed
    print(f"reference: {passed} passed, {failed} failed")
    sys.exit(1 if failed else 0)


# ---------------------------------------------------------------------------------------------
# Data


def generate_rows(rng):
    """`ticks`: 3,000 events a few seconds apart (whole microseconds, DuckDB's precision), each
    field null now and then, PRICE sometimes NaN or infinite; `quotes`: 400 events."""
    ticks, ts = [], START_NS
    for _ in range(3000):
        ts += rng.randrange(1, 120) * 1_000_000_000 + rng.randrange(0, 1000) * 1000
        price = round(rng.uniform(-50.0, 500.0), 3)
        roll = rng.random()
        if roll < 0.02:
            price = math.nan
        elif roll < 0.03:
            price = math.inf if rng.random() < 0.5 else -math.inf
        ticks.append(
            {
                "tstart": ts,
                "SYMBOL": maybe_null(rng, rng.choice(SYMBOLS)),
                "PRICE": maybe_null(rng, price),
                "QTY": maybe_null(rng, rng.randrange(-100, 10_000)),
                "LIVE": maybe_null(rng, rng.random() < 0.7),
            }
        )
    quotes, ts = [], START_NS
    for _ in range(400):
        ts += rng.randrange(1, 900) * 1_000_000_000
        quotes.append(
            {
                "tstart": ts,
                "SYMBOL": rng.choice(SYMBOLS),
                "BID": round(rng.uniform(0.0, 400.0), 2),
            }
        )
    return ticks, quotes


def maybe_null(rng, value):
    return None if rng.random() < 0.08 else value


TICKS_SCHEMA = "SYMBOL:STRING,PRICE:DOUBLE,QTY:INTEGER,LIVE:BOOLEAN"


def load_tidemark(url, ticks, quotes):
    for name, schema, rows in [
        ("ticks", TICKS_SCHEMA, ticks),
        ("quotes", "SYMBOL:STRING,BID:DOUBLE", quotes),
        ("idle", TICKS_SCHEMA, []),
    ]:
        post(url, "/v1/streams", {"name": name, "schema": schema})
        # A few appends, so the server (which the test starts with a small memtable) has
        # flushed segments with block summaries as well as events still in memory.
        for start in range(0, len(rows), 700):
            body = "\n".join(json_line(r) for r in rows[start : start + 700])
            request(url, f"/v1/streams/{name}/events", body.encode(), "application/x-ndjson")


def json_line(row):
    # JSON has no NaN or infinities: event bodies take them as the strings "NaN",
    # "Infinity" and "-Infinity" in a FLOAT or DOUBLE field.
    def text_if_not_finite(value):
        if isinstance(value, float) and not math.isfinite(value):
            return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
        return value

    return json.dumps({k: text_if_not_finite(v) for k, v in row.items()}, allow_nan=False)


def load_duckdb(ticks, quotes):
    duck = duckdb.connect()
    duck.execute("SET TimeZone = 'UTC'")
    # PostgreSQL's order, which Tidemark follows: NULLs last ascending, first descending.
    duck.execute("SET default_null_order = 'nulls_last_on_asc_first_on_desc'")
    fields = "symbol VARCHAR, price DOUBLE, qty INTEGER, live BOOLEAN"
    for name in ["ticks", "idle"]:
        duck.execute(f"CREATE TABLE {name} (tstart TIMESTAMPTZ, tend TIMESTAMPTZ, {fields})")
    duck.execute("CREATE TABLE quotes (tstart TIMESTAMPTZ, tend TIMESTAMPTZ, symbol VARCHAR, bid DOUBLE)")
    duck.executemany(
        "INSERT INTO ticks VALUES (make_timestamptz(?::BIGINT), NULL, ?, ?, ?, ?)",
        [
            [r["tstart"] // 1000, r["SYMBOL"], r["PRICE"], r["QTY"], r["LIVE"]]
            for r in ticks
        ],
    )
    duck.executemany(
        "INSERT INTO quotes VALUES (make_timestamptz(?::BIGINT), NULL, ?, ?)",
        [[r["tstart"] // 1000, r["SYMBOL"], r["BID"]] for r in quotes],
    )
    # `ts` is Tidemark's short name for tstart.
    for name in ["ticks", "idle", "quotes"]:
        duck.execute(f"CREATE VIEW {name}_v AS SELECT *, tstart AS ts FROM {name}")
    return duck


# ---------------------------------------------------------------------------------------------
# The corpus: (Tidemark's SQL, DuckDB's SQL, whether the answer's order is defined)


def same(sql, ordered=False):
    return (sql, sql, ordered)


def fixed_queries():
    """Issue 21's table over `ticks`, each query as a user typed it."""
    return [
        # GROUP BY a field with count/avg; ORDER BY ts DESC LIMIT; IN + BETWEEN
        same(
            "SELECT symbol, count(*), avg(price) FROM ticks WHERE price BETWEEN -1e300 AND 1e300 "
            "GROUP BY symbol"
        ),
        same("SELECT ts, symbol, price FROM ticks ORDER BY ts DESC LIMIT 10", True),
        same(
            "SELECT count(*) FROM ticks WHERE symbol IN ('AAPL', 'MSFT') "
            "AND qty BETWEEN 100 AND 2000"
        ),
        (
            "SELECT time_bucket('15 minutes', ts) AS b, max(qty) FROM ticks GROUP BY b "
            "ORDER BY b DESC LIMIT 5",
            "SELECT time_bucket(INTERVAL '15 minutes', ts) AS b, max(qty) FROM ticks_v "
            "GROUP BY b ORDER BY b DESC LIMIT 5",
            True,
        ),
        # OR, NOT, LIKE, HAVING, OFFSET, arithmetic
        same("SELECT count(*) FROM ticks WHERE symbol = 'ABC' OR qty < 0"),
        same("SELECT count(*) FROM ticks WHERE NOT (symbol = 'ABC')"),
        same("SELECT count(*) FROM ticks WHERE symbol LIKE 'A%'"),
        same(
            "SELECT symbol, count(*) AS c FROM ticks GROUP BY symbol HAVING count(*) > 500 "
            "ORDER BY symbol",
            True,
        ),
        same("SELECT ts, qty * 2 FROM ticks ORDER BY ts LIMIT 5 OFFSET 100", True),
        same("SELECT max(qty) - min(qty) AS spread FROM ticks"),
        # DISTINCT
        same("SELECT count(DISTINCT symbol) FROM ticks"),
        same("SELECT DISTINCT symbol FROM ticks ORDER BY 1", True),
        # ORDER BY an aggregate alias or a field
        same(
            "SELECT symbol, sum(qty) AS total FROM ticks GROUP BY symbol ORDER BY total DESC",
            True,
        ),
        same("SELECT qty FROM ticks ORDER BY qty DESC, ts LIMIT 3", True),
        # JOIN of two streams, and an as-of join on time (the last quote at or before a tick)
        same(
            "SELECT t.symbol, count(*), sum(q.bid) FROM ticks t JOIN quotes q "
            "ON t.symbol = q.symbol GROUP BY t.symbol"
        ),
        same(
            "SELECT ts, symbol, bid FROM (SELECT t.ts, t.symbol, q.bid, row_number() OVER "
            "(PARTITION BY t.ts, t.symbol ORDER BY q.ts DESC) AS r FROM ticks t "
            "LEFT JOIN quotes q ON q.symbol = t.symbol AND q.ts <= t.ts) WHERE r = 1 "
            "ORDER BY ts LIMIT 50",
            True,
        ),
        # date_trunc, to_timestamp, extract, formatting ts
        same(
            "SELECT date_trunc('hour', ts) AS h, count(*) FROM ticks GROUP BY h ORDER BY h",
            True,
        ),
        same("SELECT count(*) FROM ticks WHERE ts >= to_timestamp(1774760400)"),
        same("SELECT extract(minute FROM ts), count(*) FROM ticks GROUP BY 1"),
        (
            "SELECT to_char(ts, '%Y-%m-%d %H:%M') FROM ticks ORDER BY ts LIMIT 5",
            "SELECT strftime(ts, '%Y-%m-%d %H:%M') FROM ticks_v ORDER BY ts LIMIT 5",
            True,
        ),
        # min(ts)
        same("SELECT min(ts), max(ts) FROM ticks"),
        # window functions, CTEs, subqueries
        same(
            "SELECT ts, qty - lag(qty) OVER (PARTITION BY symbol ORDER BY ts) FROM ticks "
            "ORDER BY ts LIMIT 40",
            True,
        ),
        same(
            "SELECT symbol, ts FROM (SELECT symbol, ts, row_number() OVER "
            "(PARTITION BY symbol ORDER BY ts) AS r FROM ticks) WHERE r <= 2 "
            "ORDER BY symbol, ts",
            True,
        ),
        same(
            "WITH big AS (SELECT * FROM ticks WHERE qty > 5000) "
            "SELECT count(*) FROM big WHERE qty > (SELECT avg(qty) FROM ticks)"
        ),
        # Grafana's PostgreSQL data source
        same(
            "SELECT count(*) FROM ticks "
            "WHERE ts BETWEEN '2026-03-29T00:00:00Z' AND '2026-03-29T01:30:00Z'"
        ),
    ]


def generated_queries(rng):
    queries = []
    for _ in range(30):
        where = predicate(rng)
        queries.append(
            same(
                f"SELECT count(*), count(price), sum(qty), min(qty), max(ts) FROM ticks "
                f"WHERE {where}"
            )
        )
    for _ in range(15):
        where = predicate(rng)
        key = rng.choice(["symbol", "live", "symbol, live"])
        queries.append(
            same(
                f"SELECT {key}, count(*), avg(qty), min(price), max(price) FROM ticks "
                f"WHERE {where} GROUP BY {key}"
            )
        )
    for _ in range(15):
        where = predicate(rng)
        column = rng.choice(["price", "qty", "symbol", "live"])
        direction = rng.choice(["", " DESC", " NULLS FIRST", " DESC NULLS LAST"])
        limit, offset = rng.randrange(1, 40), rng.randrange(0, 200)
        queries.append(
            same(
                f"SELECT ts, {column} FROM ticks WHERE {where} "
                f"ORDER BY {column}{direction}, ts LIMIT {limit} OFFSET {offset}",
                True,
            )
        )
    for width in ["1 minute", "5 minutes", "1 hour"]:
        for function in ["count(*)", "max(qty)", "sum(qty)", "avg(qty)", "min(price)"]:
            queries.append(
                (
                    f"SELECT time_bucket('{width}', ts) AS b, {function} FROM ticks "
                    f"WHERE ts < '2026-03-29T03:00:00Z' GROUP BY b",
                    f"SELECT time_bucket(INTERVAL '{width}', ts) AS b, {function} "
                    f"FROM ticks_v WHERE ts < '2026-03-29T03:00:00Z' GROUP BY b",
                    False,
                )
            )
    queries.append(
        (
            "SELECT date_bin(INTERVAL '7 minutes', ts, TIMESTAMP '1970-01-01T00:00:00Z') AS b, "
            "count(*) FROM ticks GROUP BY b",
            "SELECT time_bucket(INTERVAL '7 minutes', ts, TIMESTAMPTZ '1970-01-01 00:00:00+00') "
            "AS b, count(*) FROM ticks_v GROUP BY b",
            False,
        )
    )
    # Nulls, NaN and infinities
    queries += [
        same("SELECT count(*) - count(price), count(*) - count(symbol) FROM ticks"),
        same("SELECT count(*) FROM ticks WHERE isnan(price)"),
        same("SELECT max(price), min(price) FROM ticks"),
        same("SELECT max(price) FROM ticks WHERE NOT isnan(price)"),
        same("SELECT count(*) FROM ticks WHERE price = 'Infinity'::DOUBLE"),
        same("SELECT count(*) FROM ticks WHERE price > 1e308"),
        same("SELECT ts, price FROM ticks ORDER BY price DESC, ts LIMIT 20", True),
        same("SELECT ts, price FROM ticks ORDER BY price, ts LIMIT 20", True),
        same("SELECT ts, coalesce(price, -1.0), coalesce(symbol, '?') FROM ticks ORDER BY ts LIMIT 30", True),
        same("SELECT count(*) FROM ticks WHERE qty IS DISTINCT FROM 5"),
        same("SELECT symbol, count(*) FROM ticks WHERE symbol IS NULL GROUP BY symbol"),
        same("SELECT live, count(*), sum(CASE WHEN live THEN 1 ELSE 0 END) FROM ticks GROUP BY live"),
        same("SELECT nullif(qty, 0), count(*) FROM ticks WHERE qty BETWEEN -2 AND 2 GROUP BY 1"),
    ]
    # Empty streams
    queries += [
        same("SELECT count(*), sum(qty), max(price), min(ts) FROM idle"),
        same("SELECT symbol, count(*) FROM idle GROUP BY symbol"),
        same("SELECT * FROM idle ORDER BY ts LIMIT 5", True),
        same("SELECT count(*) FROM ticks WHERE ts < '2000-01-01T00:00:00Z'"),
        same("SELECT count(*) FROM ticks t JOIN idle i ON t.symbol = i.symbol"),
        (
            "SELECT time_bucket('1 minute', ts) AS b, count(*) FROM idle GROUP BY b",
            "SELECT time_bucket(INTERVAL '1 minute', ts) AS b, count(*) FROM idle_v GROUP BY b",
            False,
        ),
    ]
    # Time zones: literals with offsets, and local time across the clocks' change
    queries += [
        same("SELECT count(*) FROM ticks WHERE ts >= '2026-03-29T03:30:00+02:00'"),
        same("SELECT count(*) FROM ticks WHERE ts < '2026-03-28T20:00:00-05:00'"),
        same(
            "SELECT extract(hour FROM ts AT TIME ZONE 'Europe/Berlin') AS h, count(*) "
            "FROM ticks GROUP BY h"
        ),
        same(
            "SELECT extract(hour FROM ts AT TIME ZONE 'America/New_York') AS h, count(*) "
            "FROM ticks GROUP BY h"
        ),
        same(
            "SELECT extract(day FROM ts AT TIME ZONE 'Asia/Kolkata') AS d, count(*) "
            "FROM ticks GROUP BY d"
        ),
        same("SELECT extract(epoch FROM min(ts)) FROM ticks"),
        same("SELECT count(*) FROM ticks WHERE ts > now() - INTERVAL '3650 days'"),
        same("SELECT count(*) FROM ticks WHERE ts + INTERVAL '1 hour' < '2026-03-29T00:00:00Z'"),
    ]
    # Windows, joins, subqueries, strings, arithmetic
    queries += [
        same(
            "SELECT ts, sum(qty) OVER (PARTITION BY symbol ORDER BY ts ROWS BETWEEN 2 "
            "PRECEDING AND CURRENT ROW) FROM ticks ORDER BY ts LIMIT 60",
            True,
        ),
        same(
            "SELECT ts, rank() OVER (PARTITION BY live ORDER BY qty) FROM ticks "
            "WHERE qty IS NOT NULL ORDER BY ts LIMIT 60",
            True,
        ),
        same(
            "SELECT ts, lead(price) OVER (ORDER BY ts) FROM ticks ORDER BY ts DESC LIMIT 25",
            True,
        ),
        same(
            "SELECT symbol, count(*) FROM ticks WHERE symbol IN (SELECT symbol FROM quotes "
            "WHERE bid > 390) GROUP BY symbol"
        ),
        same(
            "SELECT q.symbol, max(q.bid), count(t.ts) FROM quotes q LEFT JOIN ticks t "
            "ON t.symbol = q.symbol AND t.ts BETWEEN q.ts AND q.ts + INTERVAL '1 minute' "
            "GROUP BY q.symbol"
        ),
        same("SELECT upper(symbol), lower(symbol), length(symbol) FROM ticks GROUP BY symbol"),
        same("SELECT symbol || '-' || CAST(qty AS VARCHAR) FROM ticks ORDER BY ts LIMIT 10", True),
        same("SELECT ts, abs(qty), qty % 7, qty * 3 + 1 FROM ticks ORDER BY ts LIMIT 20", True),
        same(
            "SELECT ts, price / 4 FROM ticks WHERE price BETWEEN -1e300 AND 1e300 "
            "ORDER BY ts LIMIT 20",
            True,
        ),
        same("SELECT sum(CAST(qty AS BIGINT) * 1000000) FROM ticks"),
        same(
            "SELECT symbol, stddev_samp(qty), var_pop(qty) FROM ticks GROUP BY symbol"
        ),
        same("SELECT count(*) FROM ticks WHERE symbol NOT LIKE '%B%' AND symbol <> 'abc'"),
        same("SELECT count(*) FROM ticks WHERE qty IN (SELECT qty FROM ticks WHERE qty < 0)"),
        # Semi and anti joins on the subquery's distinct keys (issue 46), NULLs on both sides.
        same(
            "SELECT count(*) FROM ticks t WHERE EXISTS "
            "(SELECT 1 FROM quotes q WHERE q.symbol = t.symbol AND q.bid > 200)"
        ),
        same(
            "SELECT count(*) FROM ticks t WHERE NOT EXISTS "
            "(SELECT 1 FROM ticks u WHERE u.symbol = t.symbol AND u.qty > 9990)"
        ),
        same("SELECT count(*) FROM ticks WHERE symbol NOT IN (SELECT symbol FROM quotes)"),
        same("SELECT count(*) FROM ticks WHERE symbol NOT IN (SELECT symbol FROM ticks)"),
        same(
            "SELECT count(*) FROM ticks WHERE symbol NOT IN "
            "(SELECT symbol FROM ticks WHERE symbol IS NOT NULL AND qty > 9000)"
        ),
        # Newest first (issue 46): filters, an offset, an alias, a time bound.
        same(
            "SELECT ts, qty FROM ticks WHERE symbol = 'MSFT' ORDER BY ts DESC LIMIT 15 OFFSET 3",
            True,
        ),
        same(
            "SELECT ts AS t, price FROM ticks WHERE ts < '2026-03-29T02:00:00Z' "
            "ORDER BY t DESC LIMIT 40",
            True,
        ),
    ]
    queries += postgresql_answers()
    return queries


def postgresql_answers():
    """Issue 43: where DataFusion's answer differs from PostgreSQL's, Tidemark's must be
    PostgreSQL's, which DuckDB shares here (or which DuckDB's SQL below computes)."""
    finite = "price BETWEEN -1e300 AND 1e300"
    return [
        # Casts to integers round: a double ties to even (PostgreSQL's rint), a number
        # written in the statement (numeric) ties away from zero.
        same(f"SELECT CAST(price AS INTEGER) AS p, count(*) FROM ticks WHERE {finite} GROUP BY p"),
        same(
            "SELECT ts, qty, CAST(qty / 2.0 AS INTEGER), (qty / 4.0)::bigint FROM ticks "
            "WHERE qty BETWEEN -60 AND 60 ORDER BY ts",
            True,
        ),
        same(
            "SELECT CAST(2.5 AS INTEGER), (-2.5)::int, 2.5::bigint, CAST(2.7 AS SMALLINT), "
            "2.5::double::int, 3.5::double::int, (-0.5)::double::int"
        ),
        # to_char with PostgreSQL's templates, against DuckDB's strftime.
        (
            "SELECT ts, to_char(ts, 'YYYY-MM-DD HH24:MI:SS.US'), "
            "to_char(ts, 'FMDay DD Mon YYYY HH12:MI AM'), to_char(ts, 'IYYY-IW-ID DDD') "
            "FROM ticks ORDER BY ts LIMIT 200",
            "SELECT ts, strftime(ts, '%Y-%m-%d %H:%M:%S.%f'), "
            "strftime(ts, '%A %d %b %Y %I:%M %p'), strftime(ts, '%G-%V-%u %j') "
            "FROM ticks ORDER BY ts LIMIT 200",
            True,
        ),
        (
            "SELECT to_char(ts AT TIME ZONE 'Europe/Berlin', 'YYYY-MM-DD HH24:MI') AS m, count(*) "
            "FROM ticks GROUP BY m",
            "SELECT strftime(ts AT TIME ZONE 'Europe/Berlin', '%Y-%m-%d %H:%M') AS m, count(*) "
            "FROM ticks GROUP BY m",
            False,
        ),
        # extract(epoch ...) of a difference of timestamps and of an interval keeps the
        # fraction of a second; second keeps its fraction (DuckDB's second does not: its
        # microseconds do).
        same("SELECT extract(epoch FROM max(ts) - min(ts)) FROM ticks"),
        same(
            "SELECT ts, extract(epoch FROM ts - lag(ts) OVER (ORDER BY ts)) FROM ticks "
            "ORDER BY ts LIMIT 50",
            True,
        ),
        same("SELECT extract(epoch FROM INTERVAL '1 year 2 months 3 days 4.5 seconds')"),
        (
            "SELECT ts, extract(second FROM ts) FROM ticks ORDER BY ts LIMIT 50",
            "SELECT ts, extract(microseconds FROM ts) / 1000000 FROM ticks ORDER BY ts LIMIT 50",
            True,
        ),
        # Comparisons with ANY and ALL of arrays.
        same("SELECT count(*) FROM ticks WHERE symbol = ANY(ARRAY['AAPL', 'abc'])"),
        same("SELECT count(*) FROM ticks WHERE symbol <> ALL(ARRAY['AAPL', 'MSFT'])"),
        # PostgreSQL's array text, as DuckDB writes a list.
        (
            "SELECT count(*) FROM ticks WHERE symbol = ANY('{BRK.B,ABC}'::VARCHAR[])",
            "SELECT count(*) FROM ticks WHERE symbol = ANY(['BRK.B', 'ABC'])",
            False,
        ),
        same("SELECT count(*) FROM ticks WHERE qty > ANY(ARRAY[5000, 9000])"),
        same("SELECT count(*) FROM ticks WHERE qty < ALL(ARRAY[5000, 9000])"),
        same(f"SELECT count(*) FROM ticks WHERE {finite} AND price <= ALL(ARRAY[100.5, 200])"),
        same(
            "SELECT symbol = ANY(ARRAY['AAPL', NULL]) AS a, symbol <> ALL(ARRAY['AAPL', NULL]) AS b, "
            "count(*) FROM ticks GROUP BY a, b"
        ),
    ]


def predicate(rng):
    """A random WHERE clause over `ticks` of one to three terms."""
    terms = [
        lambda: f"qty > {rng.randrange(-100, 10000)}",
        lambda: f"qty <= {rng.randrange(-100, 10000)}",
        lambda: f"price < {rng.uniform(-50, 500):.2f}",
        lambda: f"price >= {rng.uniform(-50, 500):.2f}",
        lambda: f"symbol = '{rng.choice(SYMBOLS)}'",
        lambda: f"symbol IN ('{rng.choice(SYMBOLS)}', '{rng.choice(SYMBOLS)}')",
        lambda: f"symbol LIKE '{rng.choice(['A', 'a', 'B', 'M'])}%'",
        lambda: "live",
        lambda: "NOT live",
        lambda: f"{rng.choice(['price', 'qty', 'symbol', 'live'])} IS NULL",
        lambda: f"{rng.choice(['price', 'qty', 'symbol'])} IS NOT NULL",
        lambda: f"ts >= '2026-03-29T{rng.randrange(0, 24):02d}:{rng.randrange(0, 60):02d}:00Z'",
        lambda: f"ts < '2026-03-29T{rng.randrange(0, 24):02d}:00:00Z'",
        lambda: f"qty BETWEEN {rng.randrange(0, 3000)} AND {rng.randrange(3000, 9000)}",
    ]
    clause = rng.choice(terms)()
    for _ in range(rng.randrange(0, 3)):
        joiner = rng.choice(["AND", "OR", "AND NOT"])
        clause = f"({clause}) {joiner} ({rng.choice(terms)()})"
    return clause


# ---------------------------------------------------------------------------------------------
# Comparison


def compare(url, duck, tidemark_sql, duckdb_sql, ordered):
    duckdb_sql = duckdb_view_names(duckdb_sql)
    try:
        expected = [normalize_duckdb_row(r) for r in duck.execute(duckdb_sql).fetchall()]
    except duckdb.Error as e:
        return f"DuckDB refused its query ({e}); fix the corpus"
    status, answer = query(url, tidemark_sql)
    if status != 200:
        return f"Tidemark answered {status}: {answer}"
    got = [[normalize_tidemark(v) for v in row] for row in answer["rows"]]
    if not ordered:
        got, expected = sorted(got, key=order_key), sorted(expected, key=order_key)
    if len(got) != len(expected):
        return f"{len(got)} rows, DuckDB {len(expected)}: {got[:5]} vs {expected[:5]}"
    for index, (g, e) in enumerate(zip(got, expected)):
        if len(g) != len(e) or not all(equal(a, b) for a, b in zip(g, e)):
            return f"row {index}: {g} vs DuckDB {e}"
    return None


def duckdb_view_names(sql):
    """DuckDB reads the views that add `ts` beside tstart."""
    return re.sub(r"\b(FROM|JOIN) (ticks|quotes|idle)\b", r"\1 \2_v", sql)


# Tidemark's JSON answers write the floats JSON has no number for as these strings (no text
# field of the corpus holds them).
NOT_FINITE = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}


def normalize_tidemark(value):
    return NOT_FINITE.get(value, value) if isinstance(value, str) else value


def normalize_duckdb_row(row):
    out = []
    for value in row:
        if isinstance(value, datetime.datetime):
            delta = value - EPOCH
            value = (delta.days * 86_400 + delta.seconds) * 10**9 + delta.microseconds * 1000
        elif isinstance(value, decimal.Decimal):
            value = float(value)
        out.append(value)
    return out


def equal(a, b):
    if a is None or b is None:
        return a is None and b is None
    if isinstance(a, bool) or isinstance(b, bool):
        return a is b or a == b and type(a) is type(b)
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        if isinstance(a, int) and isinstance(b, int):
            return a == b
        a, b = float(a), float(b)
        if math.isnan(a) or math.isnan(b):
            return math.isnan(a) and math.isnan(b)
        if math.isinf(a) or math.isinf(b):
            return a == b
        return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-9)
    return a == b


def order_key(row):
    """A total order of rows of mixed values, to compare answers whose order is undefined."""
    return [sort_key(value) for value in row]


def sort_key(value):
    if value is None:
        return (3, 0, "")
    if isinstance(value, bool):
        return (0, int(value), "")
    if isinstance(value, (int, float)):
        # NaN after every number, as in PostgreSQL.
        return (1, (1, 0.0) if math.isnan(value) else (0, float(value)), "")
    return (2, 0, str(value))


REFUSALS = [
    ("UPDATE ticks SET price = 1", "unsupported_sql", "UPDATE"),
    ("DELETE FROM ticks", "unsupported_sql", "DELETE"),
    ("SELECT nope FROM ticks", "bad_sql", "nope"),
    ("SELECT * FROM nowhere", "unknown_stream", "nowhere"),
    # As PostgreSQL: out of the integer's range is an error, not a wrapped value.
    ("SELECT CAST(1e10 AS INTEGER)", "bad_sql", "integer out of range"),
    ("SELECT ARRAY[1, 2]", "bad_sql", "x IN ("),
]


def check_refusals(url):
    """Unsupported SQL gets a 400 (an unknown stream a 404) that names the part."""
    failed = 0
    for sql, code, part in REFUSALS:
        status, answer = query(url, sql)
        text = json.dumps(answer)
        if status not in (400, 404) or answer.get("error") != code or part not in text:
            failed += 1
            print(f"refusal of {sql!r}: expected {code} naming {part!r}, got {status} {text}")
    return failed


# ---------------------------------------------------------------------------------------------
# HTTP


def query(url, sql):
    return request(url, "/v1/query", json.dumps({"sql": sql, "time": "ns"}).encode(), "application/json", check=False)


def post(url, path, body):
    return request(url, path, json.dumps(body).encode(), "application/json")


def request(url, path, body, content_type, check=True):
    req = urllib.request.Request(url + path, data=body, headers={"Content-Type": content_type})
    try:
        with urllib.request.urlopen(req, timeout=60) as answer:
            status, text = answer.status, answer.read()
    except urllib.error.HTTPError as e:
        status, text = e.code, e.read()
    parsed = json.loads(text) if text else None
    if check and status >= 300:
        raise SystemExit(f"{path} answered {status}: {text[:500]!r}")
    return status, parsed


if __name__ == "__main__":
    main()
