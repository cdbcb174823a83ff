"""What `Client.append` takes, as an Arrow table in the types of the stream's fields.

The server takes an Arrow IPC stream whose columns have exactly the Arrow types of the
stream's fields and converts nothing (docs/server.md). The conversions people expect (an
int64 column into an INTEGER field, float64 into FLOAT, pandas' strings, categoricals,
polars' string views) happen here, with Arrow's checked casts: a value that does not fit
raises before anything is sent.
"""

from __future__ import annotations

from typing import Any, Mapping

import pyarrow as pa
import pyarrow.compute as pc

#: The Arrow type each field type is sent as (the type SQL answers with).
ARROW_TYPES: Mapping[str, pa.DataType] = {
    "BOOLEAN": pa.bool_(),
    "BYTE": pa.int8(),
    "SHORT": pa.int16(),
    "INTEGER": pa.int32(),
    "LONG": pa.int64(),
    "FLOAT": pa.float32(),
    "DOUBLE": pa.float64(),
    "STRING": pa.large_string(),
    "BYTES": pa.large_binary(),
}

TIME_COLUMNS = ("tstart", "tend")


def to_table(data: Any) -> pa.Table:
    """`data` as an Arrow table: a pandas DataFrame (a ``tstart`` column, or a
    DatetimeIndex that becomes one), a pyarrow Table or RecordBatch, a polars DataFrame,
    or a list of dicts."""
    if isinstance(data, pa.Table):
        return data
    if isinstance(data, pa.RecordBatch):
        return pa.Table.from_batches([data])
    module = type(data).__module__.split(".")[0]
    if module == "pandas":
        return _from_pandas(data)
    if module == "polars":
        table = data.to_arrow()
        if not isinstance(table, pa.Table):
            raise TypeError("polars' to_arrow() did not give a pyarrow Table")
        return table
    if isinstance(data, list):
        if not all(isinstance(row, dict) for row in data):
            raise TypeError("a list of events must hold dicts (field name -> value)")
        return pa.Table.from_pylist(data)
    raise TypeError(
        f"cannot append a {type(data).__name__}: give a pandas or polars DataFrame, "
        "a pyarrow Table or RecordBatch, or a list of dicts"
    )


def _from_pandas(frame: Any) -> pa.Table:
    import pandas as pd

    if not isinstance(frame, pd.DataFrame):
        raise TypeError(f"cannot append a pandas {type(frame).__name__}: give a DataFrame")
    columns = {str(c).lower() for c in frame.columns}
    if "tstart" not in columns and isinstance(frame.index, pd.DatetimeIndex):
        frame = frame.rename_axis("tstart").reset_index()
    return pa.Table.from_pandas(frame, preserve_index=False)


def conform(table: pa.Table, fields: Mapping[str, str]) -> pa.Table:
    """`table` with each column cast to its field's Arrow type (`fields`: the stream's
    field names and types). Columns the stream does not have are left for the server to
    refuse, naming them; casts that lose values raise ValueError naming the column."""
    by_name = {name.lower(): ty for name, ty in fields.items()}
    arrays = []
    names = []
    for name, column in zip(table.column_names, table.columns):
        lowered = name.lower()
        if lowered in TIME_COLUMNS:
            column = _time(name, column)
        elif lowered in by_name:
            column = _value(name, column, by_name[lowered])
        arrays.append(column)
        names.append(name)
    return pa.Table.from_arrays(arrays, names=names)


def _plain(column: pa.ChunkedArray) -> pa.ChunkedArray:
    """Dictionary-encoded columns (pandas categoricals) as their values."""
    if pa.types.is_dictionary(column.type):
        return column.cast(column.type.value_type)
    return column


def _time(name: str, column: pa.ChunkedArray) -> pa.ChunkedArray:
    column = _plain(column)
    ty = column.type
    if pa.types.is_timestamp(ty) or ty == pa.int64() or pa.types.is_null(ty):
        return column
    if pa.types.is_integer(ty):
        return _cast(name, column, pa.int64())
    if pa.types.is_date(ty):
        return _cast(name, column, pa.timestamp("ns"))
    raise ValueError(
        f"column {name!r} is {ty}: a time column holds datetimes (any unit, any time zone) "
        "or integers of nanoseconds since the epoch"
    )


def _value(name: str, column: pa.ChunkedArray, field_type: str) -> pa.ChunkedArray:
    target = ARROW_TYPES.get(field_type)
    if target is None:
        raise ValueError(f"field {name!r} has type {field_type}, which this client does not know")
    column = _plain(column)
    ty = column.type
    if ty == target or pa.types.is_null(ty):
        return column
    if field_type == "STRING" and not (pa.types.is_string(ty) or pa.types.is_large_string(ty)
                                       or pa.types.is_string_view(ty)):
        raise ValueError(f"column {name!r} is {ty}; the field is STRING: give text")
    if field_type == "BYTES" and not (pa.types.is_binary(ty) or pa.types.is_large_binary(ty)
                                      or pa.types.is_binary_view(ty)
                                      or pa.types.is_fixed_size_binary(ty)):
        raise ValueError(f"column {name!r} is {ty}; the field is BYTES: give bytes")
    if field_type == "BOOLEAN" and not pa.types.is_boolean(ty):
        raise ValueError(f"column {name!r} is {ty}; the field is BOOLEAN: give booleans")
    if pa.types.is_floating(ty) and pa.types.is_integer(target):
        raise ValueError(
            f"column {name!r} is {ty}; the field is {field_type} (integers): round it first"
        )
    return _cast(name, column, target)


def _cast(name: str, column: pa.ChunkedArray, target: pa.DataType) -> pa.ChunkedArray:
    try:
        return pc.cast(column, target, safe=True)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as e:
        raise ValueError(f"column {name!r} cannot be sent as {target}: {e}") from e


def slices(table: pa.Table, max_rows: int, max_bytes: int) -> list[pa.Table]:
    """`table` in consecutive slices of at most `max_rows` rows and about `max_bytes`
    bytes each (by the table's average row size). Slices are views: nothing is copied."""
    rows = table.num_rows
    if rows == 0:
        return [table]
    per_row = max(table.nbytes / rows, 1.0)
    step = max(1, min(max_rows, int(max_bytes / per_row)))
    return [table.slice(start, step) for start in range(0, rows, step)]


def ipc_stream(table: pa.Table) -> pa.Buffer:
    """`table` as one Arrow IPC stream (uncompressed, as the server takes it)."""
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue()
