"""Issue 43: the answers PostgreSQL gives where DataFusion's differ, as psycopg 3 and
psycopg2 get them from Tidemark's PostgreSQL listener; prints them as one JSON document,
which crates/tidemark-server/tests/pg.rs checks.

psycopg 3 sends a Python list as an array parameter (`= ANY(%s)`): a list of numbers typed
(int2[], int8[], float8[]), a list of strings untyped, as PostgreSQL's array text
(`{a,b}`); psycopg2 writes it into the statement as `ARRAY['a','b']`.

usage: pg_postgres_answers.py HOST PORT PASSWORD
"""

import json
import sys

import psycopg
import psycopg2

host, port, password = sys.argv[1], int(sys.argv[2]), sys.argv[3]
dsn = f"host={host} port={port} user=analyst dbname=tidemark password={password}"
out = {}


def rows(cursor):
    return [[str(v) if not isinstance(v, (int, float, str)) else v for v in r] for r in cursor]


with psycopg.connect(dsn) as conn:
    q = lambda sql, params=None: rows(conn.execute(sql, params).fetchall())
    out["any_strings"] = q("SELECT host FROM cpu WHERE host = ANY(%s) ORDER BY host", (["b", "z"],))
    out["any_ints"] = q("SELECT host FROM cpu WHERE n = ANY(%s)", ([4, 10**12],))
    out["all_floats"] = q("SELECT host FROM cpu WHERE usage <> ALL(%s)", ([2.5, 3.5],))
    out["any_empty"] = q("SELECT count(*) FROM cpu WHERE host = ANY(%s)", ([],))
    out["any_null_element"] = q("SELECT count(*) FROM cpu WHERE host = ANY(%s)", (["a", None],))
    # The same in binary format: the list as a binary int2[].
    with conn.cursor(binary=True) as cur:
        out["any_binary"] = rows(cur.execute("SELECT host FROM cpu WHERE n = ANY(%s)", ([3],)))
    out["literal_arrays"] = q(
        "SELECT count(*) FROM cpu WHERE host = ANY(ARRAY['a', 'b']) AND host <> ALL('{c}')"
    )
    # Casts to integers round (a number written here is numeric: ties away from zero; a
    # double ties to even, as rint), and out of range is an error.
    out["casts"] = q(
        "SELECT CAST(2.7 AS INTEGER), (-2.5)::int, 2.5::bigint, CAST(usage AS INT) "
        "FROM cpu ORDER BY tstart"
    )
    try:
        conn.execute("SELECT CAST(1e10 AS INTEGER)")
        out["out_of_range"] = None
    except psycopg.Error as e:
        out["out_of_range"] = [e.sqlstate, str(e).strip()]
    conn.rollback()
    out["to_char"] = q(
        "SELECT to_char(tstart, 'YYYY-MM-DD HH24:MI:SS'), to_char(tstart, 'FMDay FMDDth Mon') "
        "FROM cpu ORDER BY tstart"
    )
    # The difference of two timestamps (a duration in DataFusion) keeps its fraction.
    out["epoch"] = q(
        "SELECT extract(epoch FROM (max(tstart) + INTERVAL '0.25 seconds') - min(tstart)) FROM cpu"
    )

conn2 = psycopg2.connect(dsn)
cur = conn2.cursor()
cur.execute("SELECT count(*) FROM cpu WHERE host = ANY(%s) AND n <> ALL(%s)", (["a", "b"], [4]))
out["psycopg2_any_all"] = rows(cur.fetchall())
conn2.close()

print(json.dumps(out))
