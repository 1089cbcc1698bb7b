"""HTTP's edges on the real server (``python -m app.cli --simulate``, a subprocess), raw bytes over a socket:
the request-head limit however the head arrives, two framings at once, the Host header never reflected,
HEAD served wherever GET is, and content negotiation by RFC 9110's rules."""

from __future__ import annotations

import gzip
import json

import pytest

from app.serving.protocol import MAX_HEAD_BYTES
from tests.support.replica_process import ReplicaProcess

from .raw import exchange, get, parse

# A header of 100 KB: three times the head limit (docs/security.md).
BIG_HEADER = "X-Filler: " + "a" * 100_000


# --- the request-head limit (docs/security.md: 32 KiB) -----------------------------------------------


def test_a_head_over_the_limit_sent_in_one_write_is_refused_and_closed(served: ReplicaProcess) -> None:
    data, closed = exchange(served.port, get("/livez", BIG_HEADER))
    assert parse(data).status == 400, data[:200]
    assert closed


def test_a_head_over_the_limit_sent_in_two_halves_is_refused_alike(served: ReplicaProcess) -> None:
    head = get("/livez", BIG_HEADER)
    data, closed = exchange(served.port, head[: len(head) // 2], head[len(head) // 2 :])
    assert parse(data).status == 400, data[:200]
    assert closed


def test_a_head_just_under_the_limit_is_served(served: ReplicaProcess) -> None:
    filler = "X-Filler: " + "a" * (MAX_HEAD_BYTES - 200)
    head = get("/livez", filler)
    assert len(head) < MAX_HEAD_BYTES
    data, _ = exchange(served.port, head)
    assert parse(data).status == 200, data[:200]


# --- Content-Length and Transfer-Encoding together (RFC 9112 §6.1) ------------------------------------


def test_content_length_with_transfer_encoding_is_refused_and_the_connection_closed(
    served: ReplicaProcess,
) -> None:
    smuggled = get("/livez", "Content-Length: 5", "Transfer-Encoding: chunked", close=False) + b"0\r\n\r\n"
    follow_up = get("/livez", close=False)
    data, closed = exchange(served.port, smuggled + follow_up)
    first = parse(data)
    assert first.status == 400
    assert first.headers.get("connection") == "close"
    assert closed
    assert b"HTTP/1.1" not in first.rest  # the request after it on the connection was not served


# --- the Host header is never reflected ------------------------------------------------------------


@pytest.mark.parametrize("path", ["/metrics/", "/debug/snapshot/", "/readyz/"])
def test_a_trailing_slash_is_a_json_404_without_any_location(served: ReplicaProcess, path: str) -> None:
    data, _ = exchange(served.port, get(path, "Host: evil.example"))
    response = parse(data)
    assert response.status == 404, data[:300]
    assert "location" not in response.headers
    assert b"evil.example" not in data
    assert response.headers["content-type"] == "application/json"
    assert json.loads(response.body) == {"detail": "Not Found"}


# --- HEAD wherever GET is served (RFC 9110 §9.3.2) -----------------------------------------------------


@pytest.mark.parametrize("path", ["/metrics", "/readyz", "/livez", "/debug/snapshot", "/"])
def test_head_is_answered_as_get_without_a_body(served: ReplicaProcess, path: str) -> None:
    # HEAD then GET on one connection: the GET's status line must follow the HEAD's head directly.
    data, _ = exchange(served.port, get(path, method="HEAD", close=False) + get(path))
    head = parse(data, head_only=True)
    assert head.status == 200, data[:300]
    assert int(head.headers["content-length"]) > 0
    following = parse(head.rest)
    assert following.status == 200
    assert following.headers["content-type"] == head.headers["content-type"]


def test_head_on_the_probe_listener(served: ReplicaProcess) -> None:
    assert served.probe_port is not None
    data, _ = exchange(served.probe_port, get("/readyz", method="HEAD"))
    response = parse(data, head_only=True)
    assert response.status == 200, data[:300]
    assert response.rest == b""


def test_other_methods_are_still_refused(served: ReplicaProcess) -> None:
    data, _ = exchange(served.port, get("/metrics", "Content-Length: 0", method="DELETE"))
    assert parse(data).status == 405


# --- content negotiation --------------------------------------------------------------------------------

TEXT = "text/plain; version=0.0.4; charset=utf-8"
OPENMETRICS = "application/openmetrics-text; version=1.0.0; charset=utf-8"


@pytest.mark.parametrize(
    ("accept", "content_type"),
    [
        # A q that is not a qvalue refuses its item, it does not make it the favourite.
        ("application/openmetrics-text;q=-1, text/plain;q=0.5", TEXT),
        ("application/openmetrics-text;q=abc, text/plain;q=0.5", TEXT),
        ("application/openmetrics-text;q=nan, text/plain;q=0.5", TEXT),
        ("application/openmetrics-text;q=2, text/plain;q=0.5", TEXT),
        ("application/openmetrics-text;q=1.0, text/plain;q=0.5", OPENMETRICS),
        ("application/openmetrics-text;q=0.900, text/plain;q=0.5", OPENMETRICS),
    ],
)
def test_q_values_that_are_not_qvalues_refuse_their_item(
    served: ReplicaProcess, accept: str, content_type: str
) -> None:
    response = parse(exchange(served.port, get("/metrics", f"Accept: {accept}"))[0])
    assert response.status == 200
    assert response.headers["content-type"] == content_type


@pytest.mark.parametrize("encoding", ["delimited", "DELIMITED", "Delimited"])
def test_protobuf_parameters_compare_case_insensitively(served: ReplicaProcess, encoding: str) -> None:
    accept = f"application/vnd.google.protobuf;proto=io.prometheus.client.MetricFamily;encoding={encoding}"
    response = parse(exchange(served.port, get("/metrics", f"Accept: {accept}"))[0])
    assert response.headers["content-type"].startswith("application/vnd.google.protobuf"), response.headers


@pytest.mark.parametrize(
    ("accept_encoding", "gzipped"),
    [
        ("*", True),
        ("identity;q=0", True),  # uncompressed refused, gzip not: gzip is the one answer it takes
        ("gzip", True),
        ("gzip;q=0, *", False),
        ("*;q=0, identity", False),
        ("identity", False),
        ("gzip;q=abc", False),
    ],
)
def test_accept_encoding(served: ReplicaProcess, accept_encoding: str, gzipped: bool) -> None:
    response = parse(exchange(served.port, get("/metrics", f"Accept-Encoding: {accept_encoding}"))[0])
    assert response.status == 200
    assert (response.headers.get("content-encoding") == "gzip") is gzipped, response.headers
    body = gzip.decompress(response.body) if gzipped else response.body
    assert b"trainer_metrics_build_info" in body
