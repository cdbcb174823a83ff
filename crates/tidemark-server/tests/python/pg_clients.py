"""Reads from Tidemark's PostgreSQL listener with the real clients and prints, as one JSON
document, what each got back; crates/tidemark-server/tests/pg.rs checks it.

usage: pg_clients.py HOST PORT PASSWORD
"""

import datetime
import json
import sys
import warnings

import pandas
import psycopg
import psycopg2

host, port, password = sys.argv[1], int(sys.argv[2]), sys.argv[3]
dsn = f"host={host} port={port} user=analyst dbname=tidemark password={password}"
out = {}

# psycopg 3: parameters travel apart from the text (the extended protocol), typed.
with psycopg.connect(dsn) as conn:
    since = datetime.datetime(2023, 11, 14, 22, 13, 21, tzinfo=datetime.timezone.utc)
    rows = conn.execute(
        "SELECT host, usage, n, tstart FROM cpu WHERE usage > %s AND host <> %s AND tstart >= %s ORDER BY tstart",
        (1.0, "nobody", since),
    ).fetchall()
    out["psycopg_rows"] = [[h, u, n, t.isoformat()] for (h, u, n, t) in rows]
    out["psycopg_count_int_param"] = conn.execute(
        "SELECT count(*) FROM cpu WHERE n >= %s", (4,)
    ).fetchone()[0]
    # A value that would end the statement if it were pasted into it stays a value.
    out["psycopg_injection"] = conn.execute(
        "SELECT count(*) FROM cpu WHERE host = %s", ("a' OR '1'='1",)
    ).fetchone()[0]
    # Prepared server-side and run again (prepare=True skips psycopg's threshold).
    out["psycopg_prepared"] = [
        conn.execute("SELECT count(*) FROM cpu WHERE host = %s", (h,), prepare=True).fetchone()[0]
        for h in ["a", "b", "c"]
    ]
    try:
        conn.execute("SELECT * FROM nope")
        out["psycopg_unknown_stream"] = None
    except psycopg.Error as e:
        out["psycopg_unknown_stream"] = [e.sqlstate, str(e).strip()]
    conn.rollback()
    # The errors psycopg has a class for, by SQLSTATE, as PostgreSQL would raise them.
    out["psycopg_errors"] = {}
    for name, statement in [
        ("unknown_column", "SELECT nope FROM cpu"),
        ("unknown_function", "SELECT nope(usage) FROM cpu"),
        ("not_a_number", "SELECT 'abc'::int"),
        ("division_by_zero", "SELECT count(*) / 0 FROM cpu"),
        ("syntax", "SELEC 1"),
    ]:
        try:
            conn.execute(statement)
            out["psycopg_errors"][name] = None
        except psycopg.Error as e:
            out["psycopg_errors"][name] = [e.sqlstate, type(e).__name__]
        conn.rollback()
    # The streams in PostgreSQL's own catalog.
    out["psycopg_catalog"] = [
        row[0]
        for row in conn.execute(
            "SELECT c.relname FROM pg_catalog.pg_class c "
            "JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = %s",
            ("public",),
        ).fetchall()
    ]

try:
    psycopg.connect(f"host={host} port={port} user=analyst dbname=tidemark password=wrong")
    out["psycopg_bad_password"] = None
except psycopg.OperationalError as e:
    out["psycopg_bad_password"] = str(e).strip()

# psycopg2: the simple protocol, with its parameters quoted by the client, inside the
# transaction it opens by itself.
conn2 = psycopg2.connect(dsn)
cur = conn2.cursor()
cur.execute("SELECT host, usage FROM cpu WHERE host = %s", ("b",))
out["psycopg2_rows"] = [list(r) for r in cur.fetchall()]
out["psycopg2_columns"] = [d.name for d in cur.description]
conn2.commit()

# pandas.read_sql over both connections (pandas warns that it prefers SQLAlchemy).
with warnings.catch_warnings():
    warnings.simplefilter("ignore", UserWarning)
    frame = pandas.read_sql("SELECT host, usage, n FROM cpu ORDER BY host", conn2)
    out["pandas_psycopg2"] = {
        "columns": list(frame.columns),
        "usage_sum": float(frame["usage"].sum()),
        "dtypes": [str(t) for t in frame.dtypes],
    }
    with psycopg.connect(dsn) as conn3:
        frame = pandas.read_sql(
            "SELECT tstart, usage FROM cpu WHERE usage >= %(low)s ORDER BY tstart",
            conn3,
            params={"low": 2.0},
        )
        out["pandas_psycopg"] = {
            "rows": len(frame),
            "first_time": frame["tstart"].iloc[0].isoformat(),
        }
conn2.close()

print(json.dumps(out))
