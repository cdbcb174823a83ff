"""Asks Tidemark for its health as InfluxData's 2.x client does, and prints what it read.

Run by tests/influx_clients.rs: `python influx_health.py URL`. `health()` never raises: a
`/health` answer its model refuses (a missing `name`, say) comes back as `status="fail"`
with the reason in `message`, so the script prints the fields and lets the Rust test judge.
"""

import json
import sys
import warnings

import influxdb_client

url = sys.argv[1]
with influxdb_client.InfluxDBClient(url=url, token="unused", org="ignored") as client:
    with warnings.catch_warnings():
        # health() is deprecated in favour of ping(), yet still what many users call.
        warnings.simplefilter("ignore", DeprecationWarning)
        health = client.health()
    print(
        json.dumps(
            {
                "name": health.name,
                "message": health.message,
                "status": health.status,
                "version": health.version,
                "ping": client.ping(),
            }
        )
    )
