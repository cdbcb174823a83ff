"""Reads timestamps in zones whose offsets are not whole hours with psycopg 3, in text
and in binary format, and prints as JSON what psycopg made of them; tests/pg.rs checks it.

usage: pg_time_zones.py HOST PORT PASSWORD
"""

import json
import sys

import psycopg

host, port, password = sys.argv[1], int(sys.argv[2]), sys.argv[3]
dsn = f"host={host} port={port} user=analyst dbname=tidemark password={password}"
ZONES = ["Asia/Kathmandu", "America/St_Johns", "Asia/Kolkata", "Europe/Paris", "UTC"]
out = {}
with psycopg.connect(dsn) as conn:
    for binary in (False, True):
        with conn.cursor(binary=binary) as cur:
            for zone in ZONES:
                # The zone is part of the type (DataFusion's Timestamp(ns, zone)), so it goes
                # in the text, not as a parameter.
                cur.execute(f"SELECT tstart AT TIME ZONE '{zone}' FROM cpu ORDER BY tstart")
                out[f"{'binary' if binary else 'text'} {zone}"] = [
                    t.isoformat() for (t,) in cur.fetchall()
                ]
print(json.dumps(out))
