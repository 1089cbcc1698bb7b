"""Raw bytes over a socket: what an HTTP client library would never send (a head in one write or in pieces,
two framings at once, a hostile Host), and every byte of the answer as it came."""

from __future__ import annotations

import socket
import time
from dataclasses import dataclass


@dataclass(frozen=True)
class Response:
    status: int
    headers: dict[str, str]  # lower-cased names; the last of a repeated one
    body: bytes
    rest: bytes  # bytes after this response: a further response on the same connection


def exchange(port: int, *chunks: bytes, timeout: float = 10.0) -> tuple[bytes, bool]:
    """Send ``chunks`` (each one ``sendall``) and read until the server closes or ``timeout`` passes.

    Returns everything read and whether the server closed the connection."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        for chunk in chunks:
            try:
                sock.sendall(chunk)
            except (BrokenPipeError, ConnectionResetError):
                break  # refused mid-way: what was answered is still to be read
        received = b""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            sock.settimeout(max(0.01, deadline - time.monotonic()))
            try:
                data = sock.recv(65536)
            except TimeoutError:
                return received, False
            except ConnectionResetError:
                return received, True
            if not data:
                return received, True
            received += data
        return received, False


def parse(data: bytes, *, head_only: bool = False) -> Response:
    """The first response in ``data`` (Content-Length framed; ``head_only``: an answer to HEAD, no body)."""
    head, sep, after = data.partition(b"\r\n\r\n")
    assert sep, f"no complete response head in {data[:200]!r}"
    status_line, *lines = head.decode("latin-1").split("\r\n")
    headers = {}
    for line in lines:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    length = 0 if head_only else int(headers.get("content-length", len(after)))
    return Response(int(status_line.split()[1]), headers, after[:length], after[length:])


def get(path: str, *headers: str, method: str = "GET", close: bool = True) -> bytes:
    """A request head: ``path``, Host 127.0.0.1 unless a Host is among ``headers``."""
    lines = [f"{method} {path} HTTP/1.1"]
    if not any(h.lower().startswith("host:") for h in headers):
        lines.append("Host: 127.0.0.1")
    lines.extend(headers)
    if close:
        lines.append("Connection: close")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
