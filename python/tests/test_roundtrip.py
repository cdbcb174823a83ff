"""Events go in as pandas, pyarrow, polars or dicts and come back exactly: every field type,
nulls, NaN and infinities, unicode, bytes, time zones, empty answers, and 10M rows."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import polars as pl
import pyarrow as pa
import pytest

import tidemark

EVERY_TYPE = {
    "B": "BOOLEAN", "I8": "BYTE", "I16": "SHORT", "I32": "INTEGER", "I64": "LONG",
    "F": "FLOAT", "D": "DOUBLE", "S": "STRING", "X": "BYTES",
}


def every_type_frame() -> pd.DataFrame:
    """Five events in pandas' own types: integers as int64 (cast to the fields' widths by
    the client), nullable where a null is wanted."""
    return pd.DataFrame({
        "tstart": pd.to_datetime([1, 2, 3, 4, 5], unit="ns", utc=True),
        "B": pd.array([True, False, None, True, False], dtype="boolean"),
        "I8": pd.array([-128, 127, None, 0, 1], dtype="Int64"),
        "I16": pd.array([-32768, 32767, 0, None, 2], dtype="Int64"),
        "I32": pd.array([-(2**31), 2**31 - 1, 0, 3, None], dtype="Int64"),
        "I64": pd.array([-(2**63), 2**63 - 1, None, 4, 5], dtype="Int64"),
        "F": [1.5, float("inf"), float("-inf"), float("nan"), None],
        "D": [float("nan"), float("inf"), float("-inf"), 1e308, -0.0],
        "S": ["plain", "ünïcödé ✓ 日本", "", None, "with, comma \"and\" quote\n"],
        "X": [b"\x00\xff", b"", None, bytes(range(256)), b"x"],
    })


def test_every_type_round_trips_through_pandas(client: tidemark.Client, stream_name: str) -> None:
    client.create_stream(stream_name, EVERY_TYPE)
    assert client.append(stream_name, every_type_frame()) == 5
    got = client.query(f"SELECT * FROM {stream_name} ORDER BY tstart")
    assert str(got["tstart"].dtype) == "datetime64[ns, UTC]"
    assert list(got["tstart"].astype("int64")) == [1, 2, 3, 4, 5]
    assert got["tend"].isna().all()
    assert str(got["B"].dtype) == "boolean" and str(got["I64"].dtype) == "Int64"
    assert got["B"].tolist() == [True, False, pd.NA, True, False]
    assert got["I8"].tolist() == [-128, 127, pd.NA, 0, 1]
    assert got["I16"].tolist() == [-32768, 32767, 0, pd.NA, 2]
    assert got["I32"].tolist() == [-(2**31), 2**31 - 1, 0, 3, pd.NA]
    assert got["I64"].tolist() == [-(2**63), 2**63 - 1, pd.NA, 4, 5]
    f = got["F"].tolist()
    assert f[0] == 1.5 and f[1] == math.inf and f[2] == -math.inf and math.isnan(f[3])
    d = got["D"].tolist()
    assert math.isnan(d[0]) and d[1:4] == [math.inf, -math.inf, 1e308]
    assert math.copysign(1.0, d[4]) == -1.0
    s = got["S"].tolist()
    assert s[:3] == ["plain", "ünïcödé ✓ 日本", ""] and pd.isna(s[3])
    assert s[4] == "with, comma \"and\" quote\n"
    x = got["X"].tolist()
    assert x[0] == b"\x00\xff" and x[1] == b"" and x[2] is None and x[3] == bytes(range(256))


def test_nulls_stay_distinct_from_nan_in_arrow(client: tidemark.Client, stream_name: str) -> None:
    client.create_stream(stream_name, {"F": "FLOAT", "D": "DOUBLE"})
    table = pa.table({
        "tstart": pa.array([10, 20, 30], pa.int64()),
        "F": pa.array([None, float("nan"), 2.0], pa.float32()),
        "D": pa.array([float("nan"), None, float("-inf")], pa.float64()),
    })
    assert client.append(stream_name, table) == 3
    got = client.query_arrow(f"SELECT F, D FROM {stream_name} ORDER BY tstart")
    f, d = got.column("F"), got.column("D")
    assert f.null_count == 1 and not f[0].is_valid and math.isnan(f[1].as_py())
    assert d.null_count == 1 and math.isnan(d[0].as_py()) and not d[1].is_valid
    assert d[2].as_py() == -math.inf


def test_time_zones_are_instants_and_naive_times_are_utc(
    client: tidemark.Client, stream_name: str
) -> None:
    client.create_stream(stream_name, {"N": "LONG"})
    local = pd.DatetimeIndex(["2026-03-29 01:30", "2026-03-29 03:30"]).tz_localize("Europe/Berlin")
    naive = pd.DatetimeIndex(["2026-03-29 00:30:00.000000001"])
    client.append(stream_name, pd.DataFrame({"N": [1, 2]}, index=local))  # a DatetimeIndex
    client.append(stream_name, pd.DataFrame({"tstart": naive, "N": [3]}))
    got = client.query(f"SELECT tstart, N FROM {stream_name} ORDER BY N")
    expected = [
        pd.Timestamp("2026-03-29 00:30", tz="UTC"),  # 01:30 CET
        pd.Timestamp("2026-03-29 01:30", tz="UTC"),  # 03:30 CEST
        pd.Timestamp("2026-03-29 00:30:00.000000001", tz="UTC"),
    ]
    assert list(got["tstart"]) == expected


def test_seconds_and_microseconds_and_an_end_column(client: tidemark.Client, stream_name: str) -> None:
    client.create_stream(stream_name, {"N": "INTEGER"})
    table = pa.table({
        "tstart": pa.array([1, 2], pa.timestamp("s")),
        "tend": pa.array([2_500_000, None], pa.timestamp("us", tz="UTC")),
        "N": pa.array([1, 2], pa.int64()),
    })
    client.append(stream_name, table)
    got = client.query_arrow(f"SELECT tstart, tend FROM {stream_name} ORDER BY tstart")
    assert got.column("tstart").cast(pa.int64()).to_pylist() == [1_000_000_000, 2_000_000_000]
    assert got.column("tend").cast(pa.int64()).to_pylist() == [2_500_000_000, None]


def test_polars_and_dicts_and_categoricals(client: tidemark.Client, stream_name: str) -> None:
    client.create_stream(stream_name, {"SYMBOL": "STRING", "PRICE": "FLOAT"})
    frame = pl.DataFrame({"tstart": [1, 2], "SYMBOL": ["A", "B"], "PRICE": [1.25, 2.5]})
    assert client.append(stream_name, frame) == 2
    assert client.append(stream_name, [{"tstart": 3, "SYMBOL": "C", "PRICE": 3.0},
                                       {"tstart": 4, "PRICE": 4.0}]) == 2
    categorical = pd.DataFrame({"tstart": [5, 6], "SYMBOL": pd.Categorical(["A", "A"])})
    assert client.append(stream_name, categorical) == 2
    got = client.query(f"SELECT SYMBOL, PRICE FROM {stream_name} ORDER BY tstart")
    assert got["SYMBOL"].tolist()[:3] == ["A", "B", "C"] and pd.isna(got["SYMBOL"][3])
    assert got["SYMBOL"].tolist()[4:] == ["A", "A"]
    assert got["PRICE"].tolist()[:4] == [1.25, 2.5, 3.0, 4.0] and got["PRICE"][4:].isna().all()


def test_empty_answers_keep_their_columns(client: tidemark.Client, stream_name: str) -> None:
    client.create_stream(stream_name, {"V": "DOUBLE"})
    assert client.append(stream_name, pd.DataFrame({"tstart": pd.Series([], dtype="int64"),
                                                    "V": pd.Series([], dtype="float64")})) == 0
    got = client.query(f"SELECT tstart, V FROM {stream_name}")
    assert len(got) == 0 and list(got.columns) == ["tstart", "V"]
    assert str(got["tstart"].dtype) == "datetime64[ns, UTC]"
    batches = list(client.query_batches(f"SELECT V FROM {stream_name}"))
    assert sum(b.num_rows for b in batches) == 0


def test_ten_million_rows_go_in_batches_and_come_back(
    client: tidemark.Client, stream_name: str
) -> None:
    rows = 10_000_000
    client.create_stream(stream_name, {"SYMBOL": "STRING", "SECURITYTYPE": "INTEGER",
                                       "LASTTRADEPRICE": "FLOAT"})
    rng = np.random.default_rng(7)
    frame = pd.DataFrame({
        "tstart": np.arange(rows, dtype=np.int64) * 100_000,
        "SYMBOL": pd.Categorical.from_codes(rng.integers(0, 4, rows), ["AAPL", "MSFT", "IBM", "SAP"]),
        "SECURITYTYPE": rng.integers(0, 5, rows, dtype=np.int32),
        "LASTTRADEPRICE": rng.random(rows, dtype=np.float32) * 100,
    })
    assert client.append(stream_name, frame) == rows
    total = client.query(f"SELECT count(*) AS n, sum(SECURITYTYPE) AS s FROM {stream_name}")
    assert total["n"][0] == rows
    assert total["s"][0] == int(frame["SECURITYTYPE"].sum())
    seen = 0
    for batch in client.query_batches(f"SELECT tstart FROM {stream_name}"):
        seen += batch.num_rows
    assert seen == rows
    tail = client.query(
        f"SELECT tstart, LASTTRADEPRICE FROM {stream_name} ORDER BY tstart DESC LIMIT 3")
    assert tail["LASTTRADEPRICE"].tolist() == frame["LASTTRADEPRICE"].tolist()[-1:-4:-1]


def test_stopping_early_closes_the_answer(client: tidemark.Client, stream_name: str) -> None:
    client.create_stream(stream_name, {"V": "LONG"})
    client.append(stream_name, pa.table({"tstart": pa.array(range(200_000), pa.int64()),
                                         "V": pa.array(range(200_000), pa.int64())}))
    for batch in client.query_batches(f"SELECT V FROM {stream_name}"):
        assert batch.num_rows > 0
        break
    assert client.query(f"SELECT count(*) AS n FROM {stream_name}")["n"][0] == 200_000


@pytest.mark.parametrize("value", [2**31, -(2**31) - 1])
def test_a_value_that_does_not_fit_raises_before_sending(
    client: tidemark.Client, stream_name: str, value: int
) -> None:
    client.create_stream(stream_name, {"I32": "INTEGER"})
    with pytest.raises(ValueError, match="I32"):
        client.append(stream_name, pd.DataFrame({"tstart": [1], "I32": [value]}))
    assert client.stream(stream_name).event_count == 0
