"""Writes to Tidemark with InfluxData's real Python clients, as their users do.

Run by tests/influx_clients.rs: `python influx_clients.py URL TOKEN`. The 2.x client
(`influxdb-client`) writes 2,000 points through its batching write API with gzip on, and
one record synchronously; the 1.x client (`influxdb`) pings and writes 500 points with
millisecond precision, its token as the password. The Rust test then reads all of it back
through SQL.
"""

import sys
from urllib.parse import urlparse

import influxdb
import influxdb_client
from influxdb_client.client.write_api import SYNCHRONOUS, WriteOptions

url, token = sys.argv[1], sys.argv[2]
BASE_NS = 1_700_000_000_000_000_000

with influxdb_client.InfluxDBClient(url=url, token=token, org="ignored", enable_gzip=True) as client:
    errors = []
    options = WriteOptions(batch_size=300, flush_interval=200, max_retries=5)
    with client.write_api(
        write_options=options, error_callback=lambda conf, data, e: errors.append(e)
    ) as batching:
        for i in range(2000):
            point = (
                influxdb_client.Point("v2_cpu")
                .tag("host", f"h{i % 4}")
                .field("usage", i / 2)
                .field("cores", i % 8)
                .field("note", f"point {i} ü")
                .time(BASE_NS + i * 1_000_000, write_precision="ns")
            )
            batching.write(bucket="b", record=point)
    assert not errors, errors
    client.write_api(write_options=SYNCHRONOUS).write(
        bucket="b", record='v2_cpu,host=h9 usage=-1,up=true 1700000000999000000'
    )

parts = urlparse(url)
old = influxdb.InfluxDBClient(
    host=parts.hostname, port=parts.port, username="anyone", password=token, database="db"
)
version = old.ping()
assert version, version
points = [
    {
        "measurement": "v1_temp",
        "tags": {"room": f"r{i % 5}"},
        "time": 1_700_000_000_000 + i,
        "fields": {"celsius": 20 + i / 10, "reading": i},
    }
    for i in range(500)
]
assert old.write_points(points, time_precision="ms", batch_size=200)
print("wrote 2001 points with influxdb-client and 500 with influxdb")
