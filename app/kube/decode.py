"""Bytes from the API server to projections: a msgspec typed fast path and an orjson tolerant fallback.

docs/design/k8s-protocol.md §2 and §6. Every watch line and LIST page is first decoded straight into the
projector's msgspec wire type (only the fields it needs, no intermediate dicts). Anything that fails that
(a wrong field type, a BOOKMARK or ERROR line, an object the projector rejects) takes the tolerant path:
orjson, then ``projector.from_json``, which keeps what it can. What is still unusable is skipped.

The typed decode of a watch line happens inline in the reflector's per-line loop (app/kube/reflector.py);
this module provides its pieces and the whole of LIST page decoding.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping
from typing import Any, Generic, Protocol, TypeVar, cast

import msgspec
import orjson

from app.kube.cache import KubeObject, same_uid, same_version
from app.kube.client import ApiError

T = TypeVar("T", bound=KubeObject)
T_co = TypeVar("T_co", bound=KubeObject, covariant=True)
W = TypeVar("W")


class Projector(Protocol[T_co]):
    """Turns one object into the projection the informer caches.

    Optional extensions, looked up with ``getattr`` (a projector without them works as before):

    - ``wire_key(wire) -> str``: the key the projection of ``wire`` will have. When present the informer
      passes the cached projection under that key (or None) as ``from_wire(wire, previous)``, so the
      projector can reuse what an update did not change;
    - ``same_uid(a, b) -> bool``: ``a.uid == b.uid``, for projections that store the uid compactly;
    - ``unchanged(a, b) -> bool``: the handler need not hear of ``b`` after ``a`` (checked on every update;
      by default ``a.resource_version == b.resource_version``). A projector may compare the stored
      versions (no strings built) and also say so of a new version that projects to the same state;
    - ``wire_rv(wire) -> str``: the resourceVersion of ``wire`` as sent (for the same reason);
    - ``status_wire_type`` and ``from_status_wire(wire, previous) -> T | None`` (with ``wire_key``): a
      lighter msgspec Struct for a watch update of a cached object, and its projection from that alone, or
      None when the whole object is needed (the informer then decodes the line into ``wire_type`` too).
    """

    # msgspec Struct for one object (typed fast path), with only the fields the caller needs.
    wire_type: type

    def from_wire(self, wire: Any) -> T_co: ...

    def from_json(self, obj: Any) -> T_co | None:
        """Tolerant path from a JSON value; None means unusable (no key or uid)."""
        ...


# --- wire envelopes (typed fast path) -----------------------------------------------------------


class WatchEvent(msgspec.Struct, Generic[W]):
    """One watch line; ``WatchEvent[wire_type]`` decodes the object straight into the projector's type."""

    type: str
    object: W


class ListMeta(msgspec.Struct):
    resourceVersion: str = ""
    continue_: str = msgspec.field(name="continue", default="")


class ListPage(msgspec.Struct, Generic[W]):
    metadata: ListMeta = msgspec.field(default_factory=ListMeta)
    items: list[W] | None = None


class _ObjectMeta(msgspec.Struct):
    name: str = ""
    namespace: str = ""
    resourceVersion: str = ""


class _MetaOnly(msgspec.Struct):
    metadata: _ObjectMeta = msgspec.field(default_factory=_ObjectMeta)


# An object's name and resourceVersion without decoding the rest of it (an oversized object is skipped).
_META_ONLY: msgspec.json.Decoder[_MetaOnly] = msgspec.json.Decoder(_MetaOnly)


# Deeper JSON than the interpreter's recursion limit makes msgspec raise RecursionError, even inside
# fields it skips; one such object would otherwise fail every LIST. Retrying under a higher limit
# decodes it (msgspec's per-level C stack use is small); past that the object counts as malformed.
_DEEP_RECURSION_LIMIT = 20_000


def decode_deep(decoder: msgspec.json.Decoder[Any], data: bytes | bytearray | memoryview) -> Any:
    try:
        return decoder.decode(data)
    except RecursionError:
        pass
    previous = sys.getrecursionlimit()
    sys.setrecursionlimit(max(previous, _DEEP_RECURSION_LIMIT))
    try:
        return decoder.decode(data)
    except RecursionError as exc:
        raise msgspec.DecodeError(f"JSON nested too deeply: {exc}") from None
    finally:
        sys.setrecursionlimit(previous)


# --- tolerant path helpers ---------------------------------------------------------------------


def _meta(raw: Any) -> dict[str, Any]:
    if isinstance(raw, dict):
        meta = raw.get("metadata")
        if isinstance(meta, dict):
            return meta
    return {}


def raw_rv(raw: Any) -> str:
    """``metadata.resourceVersion`` of any JSON value, "" when there is none."""
    rv = _meta(raw).get("resourceVersion")
    return rv if isinstance(rv, str) else ""


def raw_key(raw: Any) -> str | None:
    """The cache key an object would have ("namespace/name" or "name"); None without a usable name."""
    meta = _meta(raw)
    name, namespace = meta.get("name"), meta.get("namespace")
    if not isinstance(name, str) or not name:
        return None
    return f"{namespace}/{name}" if isinstance(namespace, str) and namespace else name


# Told about an object the tolerant path could not use: (reason, key or None, resourceVersion).
SkipHook = Callable[[str, "str | None", str], None]


class Decoder(Generic[T]):
    """One projector's decoders. The reflector reads the attributes directly in its hot loop."""

    def __init__(self, projector: Projector[T]) -> None:
        # Generic msgspec Structs are parametrised at runtime with the projector's wire type.
        self.event_decoder: msgspec.json.Decoder[Any] = msgspec.json.Decoder(
            cast(Any, WatchEvent)[projector.wire_type]
        )
        self.page_decoder: msgspec.json.Decoder[Any] = msgspec.json.Decoder(
            cast(Any, ListPage)[projector.wire_type]
        )
        # For pages that may hold an object above the size limit: items as raw bytes, measured one by one.
        self._raw_page_decoder: msgspec.json.Decoder[Any] = msgspec.json.Decoder(ListPage[msgspec.Raw])
        self._item_decoder: msgspec.json.Decoder[Any] = msgspec.json.Decoder(projector.wire_type)
        self.from_wire: Callable[..., T] = projector.from_wire
        # A watch update of a cached object is decoded into the lighter type first (see Projector).
        status_type = getattr(projector, "status_wire_type", None)
        self.from_status_wire: Callable[[Any, T], T | None] | None = None
        self.status_event_decoder: msgspec.json.Decoder[Any] | None = None
        if status_type is not None and getattr(projector, "wire_key", None) is not None:
            self.from_status_wire = projector.from_status_wire  # type: ignore[attr-defined]
            self.status_event_decoder = msgspec.json.Decoder(cast(Any, WatchEvent)[status_type])
        # Incremental projection (see Projector): from_wire(wire, cached projection under its key).
        self.wire_key: Callable[[Any], str] | None = getattr(projector, "wire_key", None)
        self.wire_rv: Callable[[Any], str] | None = getattr(projector, "wire_rv", None)
        self.same_uid: Callable[[T, T], bool] = getattr(projector, "same_uid", None) or same_uid
        self.unchanged: Callable[[T, T], bool] = getattr(projector, "unchanged", None) or same_version
        self._from_json = projector.from_json

    def project_json(self, raw: Any) -> T | None:
        """Tolerant projection of one JSON object; None when unusable (or when the projector fails)."""
        try:
            obj = self._from_json(raw)
        except Exception:  # the contract says None, but a projector bug must not break the informer
            return None
        if obj is None or not obj.key:
            return None
        return obj

    def page(
        self,
        body: bytes,
        cached: Mapping[str, T],
        items: dict[str, T],
        unusable: set[str],
        on_skip: SkipHook,
        *,
        max_object_bytes: int | None = None,
    ) -> tuple[str, str]:
        """Decode one LIST page into ``items``; returns (resourceVersion, continue token).

        Keys of objects that exist but are unusable go to ``unusable`` (the cache keeps their last good
        state). ``cached`` is the current cache, which an incremental projector reuses. A body that is
        not a list at all raises ``ApiError`` (status 200, reason InvalidResponse). An object whose JSON
        is larger than ``max_object_bytes`` is skipped as ``too_large``, as on the watch: otherwise an
        object skipped there would come back at the next relist.
        """
        if max_object_bytes is not None and len(body) > max_object_bytes:
            # Only a page larger than the limit can hold an object larger than it: the common page
            # keeps the single-pass decode below.
            return self._page_sized(body, cached, items, unusable, on_skip, max_object_bytes=max_object_bytes)
        try:
            page = decode_deep(self.page_decoder, body)
        except msgspec.DecodeError:
            return self._page_tolerant(body, items, unusable, on_skip)
        from_wire = self.from_wire
        wire_key = self.wire_key
        try:
            for wire in page.items or ():
                obj = from_wire(wire) if wire_key is None else from_wire(wire, cached.get(wire_key(wire)))
                if not obj.key:
                    raise ValueError("empty key")
                items[obj.key] = obj
        except Exception:
            # One item the projector cannot take: redo this page item by item, tolerantly.
            return self._page_tolerant(body, items, unusable, on_skip)
        meta: ListMeta = page.metadata
        return meta.resourceVersion, meta.continue_

    def _page_sized(
        self,
        body: bytes,
        cached: Mapping[str, T],
        items: dict[str, T],
        unusable: set[str],
        on_skip: SkipHook,
        *,
        max_object_bytes: int,
    ) -> tuple[str, str]:
        """``page`` for a large page: each item's raw JSON is measured before it is decoded."""
        try:
            page = decode_deep(self._raw_page_decoder, body)
        except msgspec.DecodeError:
            # Not even a list of JSON values: the tolerant path says what is wrong (or copes).
            return self._page_tolerant(body, items, unusable, on_skip, max_object_bytes=max_object_bytes)
        wire_key = self.wire_key
        for raw in page.items or ():
            if len(raw) > max_object_bytes:
                self._skip_too_large(bytes(raw), unusable, on_skip)
                continue
            try:
                wire = decode_deep(self._item_decoder, raw)
                previous = None if wire_key is None else cached.get(wire_key(wire))
                obj = self.from_wire(wire) if wire_key is None else self.from_wire(wire, previous)
                if not obj.key:
                    raise ValueError("empty key")
            except Exception:
                self._item_tolerant(bytes(raw), items, unusable, on_skip)
                continue
            items[obj.key] = obj
        meta: ListMeta = page.metadata
        return meta.resourceVersion, meta.continue_

    def _skip_too_large(self, raw: bytes, unusable: set[str], on_skip: SkipHook) -> None:
        # Its name is wanted (the cache keeps the object's last good state, the log names it), but not at
        # the cost of building the whole object: decode only its metadata.
        try:
            meta = decode_deep(_META_ONLY, raw).metadata
            key: str | None = f"{meta.namespace}/{meta.name}" if meta.namespace else meta.name or None
            rv = meta.resourceVersion
        except (msgspec.DecodeError, AttributeError):
            key, rv = None, ""
        on_skip("too_large", key, rv)
        if key is not None:
            unusable.add(key)

    def _item_tolerant(self, raw: bytes, items: dict[str, T], unusable: set[str], on_skip: SkipHook) -> None:
        try:
            doc = orjson.loads(raw)
        except orjson.JSONDecodeError:
            doc = None
        self._add_or_skip(doc, items, unusable, on_skip)

    def _add_or_skip(self, raw: Any, items: dict[str, T], unusable: set[str], on_skip: SkipHook) -> None:
        """Project one tolerant-path item into ``items``, or report it malformed and mark its key."""
        obj = self.project_json(raw)
        if obj is not None:
            items[obj.key] = obj
            return
        key = raw_key(raw)
        on_skip("malformed", key, raw_rv(raw))
        if key is not None:
            unusable.add(key)

    def _page_tolerant(
        self,
        body: bytes,
        items: dict[str, T],
        unusable: set[str],
        on_skip: SkipHook,
        *,
        max_object_bytes: int | None = None,
    ) -> tuple[str, str]:
        try:
            doc = orjson.loads(body)
        except orjson.JSONDecodeError as exc:
            raise ApiError(200, "InvalidResponse", f"list page is not JSON: {exc}") from exc
        if not isinstance(doc, dict):
            raise ApiError(200, "InvalidResponse", "list page is not a JSON object")
        meta = _meta(doc)
        raw_items = doc.get("items")
        if not isinstance(raw_items, list):
            if raw_items is not None:
                raise ApiError(200, "InvalidResponse", "list page has no items array")
            raw_items = []
        for raw in raw_items:
            if max_object_bytes is not None and len(orjson.dumps(raw)) > max_object_bytes:
                key = raw_key(raw)  # a rare path (the page is not valid for the typed decoders)
                on_skip("too_large", key, raw_rv(raw))
                if key is not None:
                    unusable.add(key)
                continue
            self._add_or_skip(raw, items, unusable, on_skip)
        rv = meta.get("resourceVersion")
        cont = meta.get("continue")
        return (rv if isinstance(rv, str) else "", cont if isinstance(cont, str) else "")
