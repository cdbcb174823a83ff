"""One keep-alive HTTP connection to a server, on the standard library's http.client.

No HTTP library is required: every call is one request and one answer, which http.client
does well, and a client that installs nothing but pyarrow is easier to put anywhere.
"""

from __future__ import annotations

import http.client
import json
import socket
import threading
import urllib.parse
from typing import Any, Callable, Mapping, TypeVar

from .errors import TidemarkError

T = TypeVar("T")

#: Failures of a kept-alive connection that the server closed while it was idle: the
#: request never reached it, so it is sent again once on a new connection.
_STALE = (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError)


class Answer:
    """A whole answer: status, headers (names in lower case) and body."""

    def __init__(self, status: int, headers: Mapping[str, str], body: bytes) -> None:
        self.status = status
        self.headers = headers
        self.body = body

    def json(self) -> Any:
        return json.loads(self.body)


class Connection:
    """Requests to one server, one at a time (a lock orders callers on several threads)."""

    def __init__(self, url: str, token: str | None, timeout: float) -> None:
        parts = urllib.parse.urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"url {url!r}: say http://host:port or https://host:port")
        self.url = url
        self._https = parts.scheme == "https"
        self._host = parts.hostname
        self._port = parts.port or (443 if self._https else 80)
        self._base = parts.path.rstrip("/")
        self._token = token
        self.timeout = timeout
        self._lock = threading.Lock()
        self._conn: http.client.HTTPConnection | None = None

    def open(self) -> http.client.HTTPConnection:
        """A new connection of its own (for an answer read as it streams)."""
        cls = http.client.HTTPSConnection if self._https else http.client.HTTPConnection
        conn = cls(self._host, self._port, timeout=self.timeout)
        conn.connect()
        if conn.sock is not None:
            conn.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return conn

    def headers(self, extra: Mapping[str, str] | None = None) -> dict[str, str]:
        headers = {"User-Agent": "tidemark-python/0.1"}
        if self._token:
            headers["Authorization"] = f"Bearer {self._token}"
        if extra:
            headers.update(extra)
        return headers

    def path(self, path: str) -> str:
        return self._base + path

    def request(
        self,
        method: str,
        path: str,
        body: bytes | memoryview | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> Answer:
        """Sends one request and reads its whole answer, whatever its status."""
        with self._lock:
            response = self._send(method, path, body, headers)
            try:
                data = response.read()
            except (OSError, http.client.HTTPException) as e:
                self._close()
                raise TidemarkError(0, "connection", f"{self.url}: {e}") from e
            return self._answered(response, data)

    def request_reading(
        self,
        method: str,
        path: str,
        body: bytes,
        headers: Mapping[str, str],
        read: Callable[[http.client.HTTPResponse], T],
    ) -> T:
        """Sends one request and hands a 200 answer's body, unread, to `read` (so that a
        reader such as Arrow's can parse it as it arrives, without a copy held whole);
        any other answer raises its refusal. A failure inside `read` closes the connection:
        how much of the body is left on it is unknown."""
        with self._lock:
            response = self._send(method, path, body, headers)
            try:
                if response.status != 200:
                    raise refusal(self._answered(response, response.read()))
                value = read(response)
                response.read()  # The end of the chunked body, so the connection can be reused.
            except BaseException:
                self._close()
                raise
            if response.will_close:
                self._close()
            return value

    def _send(
        self,
        method: str,
        path: str,
        body: bytes | memoryview | None,
        headers: Mapping[str, str] | None,
    ) -> http.client.HTTPResponse:
        """Sends a request and reads its status line and headers, on the kept-alive
        connection, or a new one when the server closed that one while it was idle."""
        for attempt in (1, 2):
            reused = self._conn is not None
            try:
                if self._conn is None:
                    self._conn = self.open()
                self._conn.request(method, self.path(path), body, self.headers(headers))
                return self._conn.getresponse()
            except _STALE as e:
                self._close()
                if not reused or attempt == 2:
                    raise TidemarkError(0, "connection", f"{self.url}: {e}") from e
            except (OSError, http.client.HTTPException) as e:
                self._close()
                raise TidemarkError(0, "connection", f"{self.url}: {e}") from e
        raise AssertionError("unreachable: the second attempt returns or raises")

    def _answered(self, response: http.client.HTTPResponse, data: bytes) -> Answer:
        if response.will_close:
            self._close()
        headers = {k.lower(): v for k, v in response.getheaders()}
        return Answer(response.status, headers, data)

    def close(self) -> None:
        with self._lock:
            self._close()

    def _close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None


def refusal(answer: Answer, *, appended: int = 0) -> TidemarkError:
    """The error an answer other than 2xx stands for."""
    code, message = "http_error", answer.body.decode("utf-8", "replace").strip()
    try:
        parsed = answer.json()
        if isinstance(parsed, dict):
            code = str(parsed.get("error", code))
            message = str(parsed.get("message", message))
    except ValueError:
        pass
    return TidemarkError(answer.status, code, message, appended=appended)


def retry_after(answer: Answer) -> float:
    """Seconds to wait before sending a refused (429) request again, as the server hints."""
    try:
        hinted_ms = answer.json().get("retryAfterMs")
        if isinstance(hinted_ms, (int, float)):
            return max(float(hinted_ms) / 1000.0, 0.001)
    except (ValueError, AttributeError):
        pass
    try:
        return max(float(answer.headers.get("retry-after", "1")), 0.001)
    except ValueError:
        return 1.0
