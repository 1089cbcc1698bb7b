"""Decoding of ``application/vnd.kubernetes.protobuf`` request bodies for the built-in kinds served here.

kubectl's typed commands (``kubectl create namespace``) send protobuf for built-in kinds, as client-go's
clientset does. The body is the apiserver's envelope: the magic ``k8s\\x00``, then a runtime.Unknown whose
``raw`` holds the object in the k8s.io/api generated.proto layout. Only the fields of the kinds the simulator
serves are read (Namespace, Lease; ObjectMeta's user fields); responses are always JSON.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from typing import Any, Final

from kubesim.apiserver.status import StoreError, bad_request

MAGIC: Final = b"k8s\x00"
PROTOBUF: Final = "application/vnd.kubernetes.protobuf"


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        if pos >= len(data):
            raise ValueError("truncated varint")
        b = data[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return result, pos
        shift += 7


def fields(data: bytes) -> Iterator[tuple[int, int | bytes]]:
    """(field number, value) pairs of one message: ints for varints, bytes for length-delimited."""
    pos = 0
    while pos < len(data):
        key, pos = _varint(data, pos)
        num, wire = key >> 3, key & 7
        if wire == 0:
            value, pos = _varint(data, pos)
            yield num, value
        elif wire == 2:
            size, pos = _varint(data, pos)
            yield num, data[pos : pos + size]
            pos += size
        elif wire == 1:
            yield num, struct.unpack("<q", data[pos : pos + 8])[0]
            pos += 8
        elif wire == 5:
            yield num, struct.unpack("<i", data[pos : pos + 4])[0]
            pos += 4
        else:
            raise ValueError(f"unsupported wire type {wire}")


def _text(value: int | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _map_entry(value: int | bytes) -> tuple[str, str]:
    entry = dict(fields(value if isinstance(value, bytes) else b""))
    return _text(entry.get(1, b"")), _text(entry.get(2, b""))


def _object_meta(data: bytes) -> dict[str, Any]:
    meta: dict[str, Any] = {}
    names = {1: "name", 2: "generateName", 3: "namespace", 5: "uid", 6: "resourceVersion"}
    for num, value in fields(data):
        if num in names:
            meta[names[num]] = _text(value)
        elif num in (11, 12):
            key, val = _map_entry(value)
            meta.setdefault("labels" if num == 11 else "annotations", {})[key] = val
        elif num == 14:
            meta.setdefault("finalizers", []).append(_text(value))
    return meta


def _micro_time(data: int | bytes) -> str:
    import datetime

    parts = dict(fields(data if isinstance(data, bytes) else b""))
    seconds, nanos = int(parts.get(1, 0) or 0), int(parts.get(2, 0) or 0)
    when = datetime.datetime.fromtimestamp(seconds, datetime.UTC).replace(microsecond=nanos // 1000)
    return when.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _int32(value: int | bytes) -> int:
    n = int(value) if isinstance(value, int) else 0
    return n - (1 << 64) if n >= 1 << 63 else n


def _namespace(raw: bytes) -> dict[str, Any]:
    obj: dict[str, Any] = {}
    for num, value in fields(raw):
        if num == 1 and isinstance(value, bytes):
            obj["metadata"] = _object_meta(value)
        elif num == 2 and isinstance(value, bytes):
            finalizers = [_text(v) for n, v in fields(value) if n == 1]
            obj["spec"] = {"finalizers": finalizers} if finalizers else {}
    return obj


def _lease(raw: bytes) -> dict[str, Any]:
    obj: dict[str, Any] = {}
    for num, value in fields(raw):
        if num == 1 and isinstance(value, bytes):
            obj["metadata"] = _object_meta(value)
        elif num == 2 and isinstance(value, bytes):
            spec: dict[str, Any] = {}
            for n, v in fields(value):
                if n in (1, 6, 7):
                    spec[{1: "holderIdentity", 6: "strategy", 7: "preferredHolder"}[n]] = _text(v)
                elif n in (2, 5):
                    spec["leaseDurationSeconds" if n == 2 else "leaseTransitions"] = _int32(v)
                elif n in (3, 4):
                    spec["acquireTime" if n == 3 else "renewTime"] = _micro_time(v)
            obj["spec"] = spec
    return obj


_DECODERS: Final = {("v1", "Namespace"): _namespace, ("coordination.k8s.io/v1", "Lease"): _lease}


def decode(body: bytes) -> dict[str, Any]:
    """A protobuf request body as the JSON object it stands for; 415 for kinds not decoded here."""
    if not body.startswith(MAGIC):
        raise bad_request("provided object is not protobuf: missing the k8s\\x00 prefix")
    try:
        envelope = dict(fields(body[len(MAGIC) :]))
        head = envelope.get(1, b"")
        type_meta = dict(fields(head if isinstance(head, bytes) else b""))
        api_version, kind = _text(type_meta.get(1, b"")), _text(type_meta.get(2, b""))
        raw = envelope.get(2, b"")
        decoder = _DECODERS.get((api_version, kind))
        if decoder is None or not isinstance(raw, bytes):
            raise StoreError.make(
                415,
                "UnsupportedMediaType",
                f"the body of the request was in an unknown format - accepted media types include: "
                f"application/json, application/yaml ({kind or 'this kind'} is not decoded from protobuf "
                "here)",
            )
        obj = decoder(raw)
    except (ValueError, UnicodeDecodeError, struct.error) as exc:
        raise bad_request(f"unable to decode protobuf body: {exc}") from None
    return {"apiVersion": api_version, "kind": kind, **obj}
