"""Tidemark's Python client: streams in and out as pandas, polars and Arrow.

    import tidemark
    client = tidemark.connect("http://127.0.0.1:8080")
    client.create_stream("ticks", {"SYMBOL": "STRING", "PRICE": "DOUBLE"})
    client.append("ticks", frame)                      # pandas, polars, pyarrow, dicts
    client.query("SELECT SYMBOL, avg(PRICE) FROM ticks GROUP BY SYMBOL")  # pandas
    for batch in client.subscribe("ticks", consumer="billing"):   # follows, resumes by name
        ...

Events travel as Arrow IPC streams both ways: no JSON on the hot paths.
"""

from .client import Client, Stream, connect
from .consume import Subscription
from .errors import TidemarkError

__all__ = ["Client", "Stream", "Subscription", "TidemarkError", "connect"]
__version__ = "0.1.0"
