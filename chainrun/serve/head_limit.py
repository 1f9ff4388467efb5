"""The request head's size limit, enforced as the bytes arrive.

uvicorn's httptools protocol reads a request's line and headers whole before the app
sees anything, with no limit of its own: a client could send a 128 MB header and have
it buffered. :class:`HeadLimitedProtocol` counts the bytes of each request's head (from
the end of the previous request to the end of its headers) as they are read and, past
:data:`~chainrun.serve.settings.MAX_HEAD_BYTES`, answers ``431 Request Header Fields
Too Large`` (RFC 6585 section 5) with the error object of :mod:`chainrun.serve.errors`
(code ``headers_too_large``) and closes the connection; nothing reaches the app.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from chainrun.serve.errors import error_body
from chainrun.serve.settings import MAX_HEAD_BYTES

__all__ = ["HeadLimitedProtocol", "too_large_head"]

#: s a refused connection stays open after its answer, for the client to read it
LINGER_S = 2.0


def too_large_head(limit: int) -> bytes:
    """The whole 431 response (status line, headers, JSON body), closing the connection."""
    body = json.dumps(error_body(
        f"the request's headers are over this server's limit of {limit} bytes",
        "invalid_request_error", code="headers_too_large",
    )).encode()  # fmt: skip
    return (b"HTTP/1.1 431 Request Header Fields Too Large\r\n"
            b"content-type: application/json\r\n"
            b"content-length: %d\r\nx-request-id: %s\r\nconnection: close\r\n\r\n%s"
            % (len(body), uuid.uuid4().hex.encode(), body))  # fmt: skip


class HeadLimitedProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with the head limit of the module text
    (``max_head_bytes``, a class attribute: uvicorn makes the protocol itself)."""

    max_head_bytes = MAX_HEAD_BYTES

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._in_head = True
        self._head_bytes = 0
        self._refused = False

    def data_received(self, data: bytes) -> None:
        if self._refused:  # answered 431: the rest is not read
            return
        if self._in_head:
            self._head_bytes += len(data)
        super().data_received(data)
        if self._in_head and self._head_bytes > self.max_head_bytes:
            self._refuse()

    def _refuse(self) -> None:
        """Answer 431 and close gently: closing a socket whose unread bytes wait in the
        kernel resets it (RST), and a reset can drop the answer before the client reads
        it; so the write side is shut first (FIN after the answer), reading stops, and
        the socket is closed :data:`LINGER_S` later (nginx's ``lingering_close``)."""
        self._refused = True
        if self.transport.is_closing():
            return
        self.transport.write(too_large_head(self.max_head_bytes))
        self.transport.pause_reading()
        if self.transport.can_write_eof():
            self.transport.write_eof()
            self.loop.call_later(LINGER_S, self.transport.close)
        else:
            self.transport.close()

    def on_headers_complete(self) -> None:
        self._in_head = False
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        super().on_message_complete()
        self._in_head, self._head_bytes = True, 0  # the next bytes are the next head
