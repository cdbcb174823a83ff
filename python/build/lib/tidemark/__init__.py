"""Tidemark's Python client: streams in and out as pandas, polars and Arrow.

    import tidemark
    client = tidemark.connect("http://127.0.0.1:8080")
    client.create_stream("ticks", {"SYMBOL": "STRING", "PRICE": "DOUBLE"})
    client.append("ticks", frame)                      # pandas, polars, pyarrow, dicts
    client.query("SELECT SYMBOL, avg(PRICE) FROM ticks GROUP BY SYMBOL")  # pandas

Events travel as Arrow IPC streams both ways: no JSON on the hot paths.
"""

from .client import Client, Stream, connect
from .errors import TidemarkError

__all__ = ["Client", "Stream", "TidemarkError", "connect"]
__version__ = "0.1.0"
