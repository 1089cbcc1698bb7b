"""A ``coordination.k8s.io/v1`` Lease: its API calls, its parsed record, the body we write.

Leader election (app/kube/elector.py) is built on these; the wire rules are in
docs/design/k8s-protocol.md §4: every spec field is an optional pointer, times are MicroTime with exactly
six fractional digits, a PUT replaces the whole object and carries the resourceVersion it read.
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol

from app.kube.client import ApiError, KubeClient
from app.kube.microtime import format_microtime, parse_microtime
from app.kube.resources import LEASES

# --- API access ------------------------------------------------------------------------------------


class LeaseClient(Protocol):
    """The three Lease calls the elector makes. Errors are exceptions; 409 and friends carry ``.status``."""

    async def get(self, namespace: str, name: str) -> dict[str, Any] | None:
        """The Lease object, or None when it does not exist (404)."""
        ...

    async def create(self, namespace: str, body: dict[str, Any]) -> dict[str, Any]: ...

    async def replace(self, namespace: str, name: str, body: dict[str, Any]) -> dict[str, Any]: ...


class KubeLeaseClient:
    """`LeaseClient` over `KubeClient.request_json`; ``ApiError`` (``.status``) propagates, but 404 on GET.

    ``request_timeout`` is only a backstop for calls made outside an elector deadline: the elector itself
    bounds every round with ``asyncio.timeout``.
    """

    def __init__(self, client: KubeClient, *, request_timeout: float = 10.0) -> None:
        self._client = client
        self._timeout = request_timeout

    async def get(self, namespace: str, name: str) -> dict[str, Any] | None:
        try:
            obj = await self._client.request_json(
                "GET", LEASES.object_path(name, namespace), timeout=self._timeout
            )
        except ApiError as exc:
            if exc.status == 404:
                return None
            raise
        return _expect_object(obj)

    async def create(self, namespace: str, body: dict[str, Any]) -> dict[str, Any]:
        obj = await self._client.request_json(
            "POST", LEASES.collection_path(namespace), body=body, timeout=self._timeout
        )
        return _expect_object(obj)

    async def replace(self, namespace: str, name: str, body: dict[str, Any]) -> dict[str, Any]:
        obj = await self._client.request_json(
            "PUT", LEASES.object_path(name, namespace), body=body, timeout=self._timeout
        )
        return _expect_object(obj)


def _expect_object(obj: Any) -> dict[str, Any]:
    if not isinstance(obj, dict):
        raise MalformedLease(f"Lease response is not a JSON object: {type(obj).__name__}")
    return obj


# --- the record ------------------------------------------------------------------------------------


class MalformedLease(ValueError):
    """A Lease whose fields cannot be read (wrong types, bad MicroTime). Never raised out of the elector."""


@dataclass(frozen=True, slots=True)
class LeaseRecord:
    """What a Lease says, parsed. ``holder_identity == ""`` means free (e.g. released)."""

    holder_identity: str
    lease_duration_seconds: int
    acquire_time: datetime | None
    renew_time: datetime | None
    lease_transitions: int
    annotations: Mapping[str, str]
    resource_version: str


def parse_lease(obj: Any) -> LeaseRecord:
    """Parse a Lease object; raise `MalformedLease` for anything the API server would not have produced.

    Missing fields are legal (all spec fields are optional pointers): no holder = free, no duration = 0 =
    already expired (as in client-go), no transitions = 0. A missing spec is an empty spec.
    """
    if not isinstance(obj, dict):
        raise MalformedLease(f"Lease is not a JSON object: {type(obj).__name__}")
    meta = obj.get("metadata")
    if not isinstance(meta, dict):
        raise MalformedLease("Lease has no metadata object")
    spec = obj.get("spec")
    if spec is None:
        spec = {}
    if not isinstance(spec, dict):
        raise MalformedLease(f"Lease spec is not an object: {type(spec).__name__}")

    holder = spec.get("holderIdentity")
    if holder is None:
        holder = ""
    if not isinstance(holder, str):
        raise MalformedLease(f"holderIdentity is not a string: {holder!r}")
    return LeaseRecord(
        holder_identity=holder,
        lease_duration_seconds=max(0, _int_field(spec, "leaseDurationSeconds")),
        acquire_time=_time_field(spec, "acquireTime"),
        renew_time=_time_field(spec, "renewTime"),
        lease_transitions=max(0, _int_field(spec, "leaseTransitions")),
        annotations=_annotations_of(meta),
        resource_version=str(meta.get("resourceVersion") or ""),
    )


def _int_field(spec: dict[str, Any], key: str) -> int:
    value = spec.get(key)
    if value is None:
        return 0
    # bool is an int subclass; a Go int32 field never decodes from true/false.
    if isinstance(value, bool) or not isinstance(value, int):
        raise MalformedLease(f"{key} is not an integer: {value!r}")
    return value


def _time_field(spec: dict[str, Any], key: str) -> datetime | None:
    value = spec.get(key)
    if value is None:
        return None
    try:
        return parse_microtime(value)
    except ValueError as exc:
        raise MalformedLease(f"{key}: {exc}") from None


def _annotations_of(meta: dict[str, Any]) -> dict[str, str]:
    # Annotations are informative (watermark hand-over); odd entries are dropped rather than fatal.
    raw = meta.get("annotations")
    if not isinstance(raw, dict):
        return {}
    return {k: v for k, v in raw.items() if isinstance(k, str) and isinstance(v, str)}


# --- the body we write -----------------------------------------------------------------------------


def lease_body(
    base: dict[str, Any] | None,
    *,
    name: str,
    namespace: str,
    holder: str,
    duration: int,
    acquire: datetime,
    renew: datetime,
    transitions: int,
    annotations: Mapping[str, str] | None,
) -> dict[str, Any]:
    """A full Lease for PUT/POST. PUT replaces the object, so everything else in it (labels, owner
    references, other spec fields such as strategy) is carried over from ``base``. ``annotations`` are
    merged over the existing ones (None: keep those as they are)."""
    if base is None:
        meta: dict[str, Any] = {"name": name, "namespace": namespace}
        spec: dict[str, Any] = {}
    else:
        raw_meta = base.get("metadata")
        meta = copy.deepcopy(raw_meta) if isinstance(raw_meta, dict) else {}
        meta.pop("managedFields", None)  # omitted = the server keeps them
        raw_spec = base.get("spec")
        spec = copy.deepcopy(raw_spec) if isinstance(raw_spec, dict) else {}
    merged = _merged_annotations(meta.get("annotations"), annotations)
    if merged:
        meta["annotations"] = merged
    spec.update(
        holderIdentity=holder,
        leaseDurationSeconds=duration,
        acquireTime=format_microtime(acquire),
        renewTime=format_microtime(renew),
        leaseTransitions=transitions,
    )
    return {"apiVersion": LEASES.api_version, "kind": LEASES.kind, "metadata": meta, "spec": spec}


def _merged_annotations(existing: Any, ours: Mapping[str, str] | None) -> dict[str, str]:
    merged = {k: v for k, v in existing.items() if isinstance(k, str)} if isinstance(existing, dict) else {}
    for key, value in (ours or {}).items():
        if isinstance(key, str) and isinstance(value, str):
            merged[key] = value
    return merged


def loose_int(lease: Any, key: str) -> int:
    """Best-effort integer spec field of an unreadable Lease (for the transition count)."""
    with contextlib.suppress(Exception):
        value = lease["spec"][key]
        if isinstance(value, int) and not isinstance(value, bool):
            return max(0, value)
    return 0
