"""Browses Tidemark's PostgreSQL listener with the tools people point at a PostgreSQL port and
prints, as one JSON document, what each got back; crates/tidemark-server/tests/pg.rs checks it.

- SQLAlchemy 2 over psycopg 3 and over psycopg2: connect (its first statements read
  version(), current_schema() and settings), reflect (inspect: schemas, tables, columns),
  pandas.read_sql through an engine (what pandas recommends);
- Grafana's PostgreSQL data source: its catalog queries (the version check, TimescaleDB,
  the table, column and schema pickers) from the fixtures file, each run as Grafana sends it.

- pandas' DataFrame.to_sql through SQLAlchemy (both drivers), with WRITE_PASSWORD.

usage: pg_tools.py HOST PORT PASSWORD STREAM GRAFANA_QUERIES_FILE [WRITE_PASSWORD]
"""

import json
import re
import sys
import warnings

import pandas
import psycopg
import sqlalchemy

host, port, password, stream, grafana_file = sys.argv[1:6]
write_password = sys.argv[6] if len(sys.argv) > 6 else None
out = {}

def step(got, name, work):
    """Runs one step of a tool and keeps what it got, or what failed."""
    try:
        got[name] = work()
    except Exception as e:  # what failed, for the test's message
        got[name] = {"error": f"{type(e).__name__}: {e}"}


for driver in ["psycopg", "psycopg2"]:
    url = f"postgresql+{driver}://analyst:{password}@{host}:{port}/tidemark"
    engine = sqlalchemy.create_engine(url)
    got = {}

    def connect():
        with engine.connect() as conn:
            count = conn.execute(sqlalchemy.text(f"SELECT count(*) FROM {stream}")).scalar()
            return [list(engine.dialect.server_version_info), count]

    step(got, "connect", connect)

    def read_sql():
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            frame = pandas.read_sql(f"SELECT * FROM {stream} ORDER BY tstart", engine)
        return {
            "rows": len(frame),
            "columns": list(frame.columns),
            "warnings": [str(w.message) for w in caught],
        }

    step(got, "read_sql", read_sql)
    inspect = lambda: sqlalchemy.inspect(engine)  # noqa: E731 (connects: a step of its own)
    step(got, "schemas", lambda: inspect().get_schema_names())
    step(got, "tables", lambda: inspect().get_table_names())
    step(got, "has_table", lambda: [inspect().has_table(stream), inspect().has_table("nope")])
    step(
        got,
        "columns",
        lambda: [[c["name"], str(c["type"]), c["nullable"]] for c in inspect().get_columns(stream)],
    )
    # Reflected as a Table, as an ORM or Superset does.
    step(
        got,
        "reflected",
        lambda: [
            c.name
            for c in sqlalchemy.Table(stream, sqlalchemy.MetaData(), autoload_with=engine).columns
        ],
    )
    out[driver] = got

# Grafana: each query as its data source sends it, over psycopg (the extended protocol, as
# Grafana's Go driver). The backend's queries bind parameters ($1 = 'public' in the comment
# before them): psycopg writes them as %s and sends $1 again.
queries = []
name, text, params = None, [], []
for line in open(grafana_file, encoding="utf-8"):
    m = re.match(r"--\s*name:\s*(\w+)", line)
    if m:
        name = m.group(1)
        continue
    if line.startswith("--"):
        params = re.findall(r"\$\d+ = '([^']*)'", line) or params
        continue
    if name is not None:
        text.append(line)
        if line.rstrip().endswith(";"):
            # The queries were collected for a table `trades`: asked of this test's stream.
            sql = "".join(text).strip().rstrip(";").replace("trades", stream)
            if params:
                sql = re.sub(r"\$\d+", "%s", sql)
            queries.append((name, sql, [p.replace("trades", stream) for p in params]))
            name, text, params = None, [], []
grafana = {}
with psycopg.connect(
    f"host={host} port={port} user=grafana dbname=tidemark password={password}", autocommit=True
) as conn:
    for name, sql, params in queries:
        try:
            rows = conn.execute(sql, params or None).fetchall()
            grafana[name] = [[str(v) for v in row] for row in rows]
        except psycopg.Error as e:
            grafana[name] = {"error": f"{e.sqlstate}: {str(e).strip()}"}
out["grafana"] = grafana

# pandas' DataFrame.to_sql through SQLAlchemy, with the write token: it checks the table
# exists (the catalog), then INSERTs the frame's rows with parameters. After the reads
# above, which count the stream as it was.
if write_password is not None:
    for driver in ["psycopg", "psycopg2"]:
        url = f"postgresql+{driver}://loader:{write_password}@{host}:{port}/tidemark"
        engine = sqlalchemy.create_engine(url)
        frame = pandas.DataFrame(
            {
                "tstart": pandas.to_datetime(
                    ["2023-11-14T22:15:00Z", "2023-11-14T22:15:01Z"], utc=True
                ),
                "host": [driver, driver],
                "usage": [7.5, 8.5],
            }
        )
        got = {}
        step(
            got,
            "to_sql",
            lambda: frame.to_sql(stream, engine, if_exists="append", index=False),
        )

        def read_back():
            with engine.connect() as conn:
                rows = conn.execute(
                    sqlalchemy.text(
                        f"SELECT tstart, usage FROM {stream} WHERE host = :h ORDER BY tstart"
                    ),
                    {"h": driver},
                ).fetchall()
            return [[row[0].isoformat(), row[1]] for row in rows]

        step(got, "read_back", read_back)
        out[f"to_sql_{driver}"] = got

    # A ROLLBACK after an INSERT in the same transaction cannot undo it, and warns so.
    with psycopg.connect(
        f"host={host} port={port} user=loader dbname=tidemark password={write_password}"
    ) as conn:
        notices = []
        conn.add_notice_handler(
            lambda d: notices.append([d.severity, d.sqlstate, d.message_primary])
        )
        conn.execute(
            f"INSERT INTO {stream} (tstart, host, usage) "
            "VALUES ('2023-11-14T22:16:00Z', 'rolled back', 1.0)"
        )
        conn.rollback()
        conn.execute("SELECT 1")  # a transaction with no write: no warning
        conn.rollback()
        stayed = conn.execute(
            f"SELECT count(*) FROM {stream} WHERE host = 'rolled back'"
        ).fetchone()[0]
        out["rollback"] = {"notices": notices, "stayed": stayed}

print(json.dumps(out))
