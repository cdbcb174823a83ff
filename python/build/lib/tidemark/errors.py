"""What a failed call raises."""

from __future__ import annotations


class TidemarkError(Exception):
    """The server refused a request, or could not be reached.

    ``status`` is the HTTP status (0 when no answer came), ``code`` the server's error code
    (``bad_request``, ``not_found``, ``overloaded``, ``unavailable``... as docs/server.md
    lists them; ``connection`` when no answer came) and ``message`` its explanation.

    ``appended`` is set by :meth:`tidemark.Client.append`: how many events of the call
    were stored, durably, before the failure. They are the first ``appended`` rows of the
    data in its order (batches are sent in order and each is stored whole or not at all),
    so a caller can resume from ``data[appended:]``.
    """

    def __init__(self, status: int, code: str, message: str, *, appended: int = 0) -> None:
        super().__init__(f"{code} ({status}): {message}" if status else f"{code}: {message}")
        self.status = status
        self.code = code
        self.message = message
        self.appended = appended
