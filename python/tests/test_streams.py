"""Streams: create (spec or mapping), describe, list, drop; refusals carry the server's code."""

from __future__ import annotations

import pytest

import tidemark


def test_create_with_a_mapping_or_a_spec_describe_list_and_drop(
    client: tidemark.Client, stream_name: str
) -> None:
    created = client.create_stream(stream_name, {"SYMBOL": "STRING", "PRICE": "DOUBLE"})
    assert created.name == stream_name
    assert created.schema == {"SYMBOL": "STRING", "PRICE": "DOUBLE"}
    assert created.event_count == 0 and created.first_ns is None
    again = client.create_stream(stream_name, "SYMBOL:STRING,PRICE:DOUBLE")
    assert again.schema == created.schema
    assert stream_name in [s.name for s in client.streams()]
    client.drop_stream(stream_name)
    assert stream_name not in [s.name for s in client.streams()]
    with pytest.raises(tidemark.TidemarkError) as missing:
        client.stream(stream_name)
    assert missing.value.status == 404
    assert stream_name in missing.value.message


def test_a_schema_conflict_and_a_bad_type_are_refused_with_the_servers_words(
    client: tidemark.Client, stream_name: str
) -> None:
    client.create_stream(stream_name, {"A": "INTEGER"})
    with pytest.raises(tidemark.TidemarkError) as conflict:
        client.create_stream(stream_name, {"A": "DOUBLE"})
    assert conflict.value.status in (400, 409)
    with pytest.raises(tidemark.TidemarkError) as bad:
        client.create_stream(stream_name + "_x", {"A": "DECIMAL"})
    assert bad.value.status == 400 and "DECIMAL" in bad.value.message


def test_a_stream_is_created_with_its_partition(
    client: tidemark.Client, stream_name: str
) -> None:
    assert client.create_stream(stream_name, {"V": "LONG"}).partition == "1d"
    hourly = client.create_stream(stream_name + "_6h", {"V": "LONG"}, partition="6h")
    assert hourly.partition == "6h" and client.stream(stream_name + "_6h").partition == "6h"
    with pytest.raises(tidemark.TidemarkError) as bad:
        client.create_stream(stream_name + "_5h", {"V": "LONG"}, partition="5h")
    assert bad.value.status == 400 and "partition" in bad.value.message
    with pytest.raises(tidemark.TidemarkError) as other:
        client.create_stream(stream_name + "_6h", {"V": "LONG"}, partition="1d")
    assert other.value.status == 409 and "6h" in other.value.message


def test_an_unreachable_server_is_a_connection_error() -> None:
    from conftest import free_port

    with tidemark.connect(f"http://127.0.0.1:{free_port()}", timeout=2) as nowhere:
        with pytest.raises(tidemark.TidemarkError) as error:
            nowhere.streams()
    assert error.value.status == 0 and error.value.code == "connection"
