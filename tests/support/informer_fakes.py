"""Informer test doubles, shared by tests/kube and tests/badinput.

* ``FakeClient``/``FakeStream`` (``running``, ``until``): an in-memory stand-in for ``KubeClient.stream``,
  the informer driven through its real loop, no HTTP. The test queues LIST bodies (or errors) and WATCH
  streams (or errors); the informer takes them in order. A request with nothing queued, or a read past the
  chunks pushed so far, waits for the test. ``idle()`` returns once the informer waits like that: everything
  given to it so far has been processed, which makes the tests deterministic without sleeping.
* A toy resource (``THINGS``), its projector (``Projector`` → ``Thing``), a handler that records what it is
  told (``Recorder``) and an object builder (``obj``).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any

import msgspec

from app.kube.informer import Informer
from app.kube.resources import ResourceKind

THINGS = ResourceKind("example.com", "v1", "things", "Thing", namespaced=True)


# --- test projector ------------------------------------------------------------------------------


class Meta(msgspec.Struct):
    name: str
    uid: str
    namespace: str = ""
    resourceVersion: str = ""


class Spec(msgspec.Struct):
    value: int = 0


class Wire(msgspec.Struct):
    metadata: Meta
    spec: Spec | None = None


class Thing(msgspec.Struct, frozen=True):
    key: str
    uid: str
    resource_version: str
    value: int | None


class Projector:
    wire_type: type = Wire

    def __init__(self) -> None:
        self.typed = 0
        self.tolerant = 0

    def from_wire(self, wire: Any) -> Thing:
        self.typed += 1
        w: Wire = wire
        m = w.metadata
        key = f"{m.namespace}/{m.name}" if m.namespace else m.name
        return Thing(key, m.uid, m.resourceVersion, w.spec.value if w.spec else 0)

    def from_json(self, obj: Any) -> Thing | None:
        self.tolerant += 1
        meta = obj.get("metadata") if isinstance(obj, dict) else None
        if not isinstance(meta, dict):
            return None
        name, uid, ns = meta.get("name"), meta.get("uid"), meta.get("namespace") or ""
        if not isinstance(name, str) or not name or not isinstance(uid, str):
            return None
        spec = obj.get("spec")
        value = spec.get("value") if isinstance(spec, dict) else None
        return Thing(
            f"{ns}/{name}" if ns else name,
            uid,
            str(meta.get("resourceVersion", "")),
            value if isinstance(value, int) else None,
        )


class Recorder:
    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []
        self.fail_on: set[str] = set()

    def on_added(self, obj: Thing, initial: bool) -> None:
        self.calls.append(("added", obj.key, obj.resource_version, initial))
        if obj.key in self.fail_on:
            raise RuntimeError("handler bug")

    def on_updated(self, old: Thing, new: Thing) -> None:
        self.calls.append(("updated", new.key, old.resource_version, new.resource_version))
        if new.key in self.fail_on:
            raise RuntimeError("handler bug")

    def on_deleted(self, last: Thing) -> None:
        self.calls.append(("deleted", last.key, last.resource_version))


def obj(name: str, rv: int, *, uid: str | None = None, value: Any = 1, ns: str = "ns") -> dict[str, Any]:
    return {
        "apiVersion": "example.com/v1",
        "kind": "Thing",
        "metadata": {
            "name": name,
            "namespace": ns,
            "uid": uid or f"uid-{name}",
            "resourceVersion": str(rv),
            "managedFields": [{"manager": "x", "fieldsV1": {"f:spec": {}}}],
        },
        "spec": {"value": value},
    }


class FakeStream:
    """A watch body. ``on_read`` is called at every ``readany()`` (i.e. once the previous chunk is done)."""

    def __init__(self, client: FakeClient, on_read: Callable[[], None] | None = None) -> None:
        self._client = client
        self._chunks: deque[bytes] = deque()
        self._closed = False
        self._on_read = on_read
        self.reads = 0

    def push(self, *chunks: bytes) -> FakeStream:
        self._chunks.extend(chunks)
        self._client.changed()
        return self

    def close(self) -> None:
        """A clean end of stream once the pushed chunks are read."""
        self._closed = True
        self._client.changed()

    async def readany(self) -> bytes:
        self.reads += 1
        if self._on_read is not None:
            self._on_read()
        while not self._chunks:
            if self._closed:
                return b""
            await self._client.wait()
        return self._chunks.popleft()


class FakeResponse:
    def __init__(self, content: FakeStream | None = None, body: bytes = b"") -> None:
        self.content = content
        self._body = body

    async def read(self) -> bytes:
        return self._body


class FakeClient:
    """``stream(path, query=..., timeout=...)`` as the reflector calls it; ``requests`` records queries."""

    def __init__(self) -> None:
        self.lists: deque[bytes | BaseException] = deque()
        self.watches: deque[FakeStream | BaseException] = deque()
        self.requests: list[dict[str, str]] = []
        self._wakeup = asyncio.Event()
        self._idle = asyncio.Event()

    def add_list(self, body: bytes | BaseException) -> None:
        self.lists.append(body)
        self.changed()

    def add_watch(
        self, *chunks: bytes, error: BaseException | None = None, on_read: Callable[[], None] | None = None
    ) -> FakeStream:
        stream = FakeStream(self, on_read)
        stream.push(*chunks)
        self.watches.append(error if error is not None else stream)
        self.changed()
        return stream

    def list_queries(self) -> list[dict[str, str]]:
        return [q for q in self.requests if q.get("watch") != "true"]

    def watch_queries(self) -> list[dict[str, str]]:
        return [q for q in self.requests if q.get("watch") == "true"]

    @contextlib.asynccontextmanager
    async def stream(
        self, path: str, *, query: Mapping[str, str], timeout: Any
    ) -> AsyncIterator[FakeResponse]:
        self.requests.append(dict(query))
        watch = query.get("watch") == "true"
        queue: deque[Any] = self.watches if watch else self.lists
        while not queue:
            await self.wait()
        item = queue.popleft()
        if isinstance(item, BaseException):
            raise item
        yield FakeResponse(item) if watch else FakeResponse(body=item)

    # --- synchronisation with the test ------------------------------------------------------------

    async def wait(self) -> None:
        self._idle.set()
        self._wakeup.clear()
        await self._wakeup.wait()

    def changed(self) -> None:
        self._idle.clear()
        self._wakeup.set()

    async def idle(self, timeout: float = 10.0) -> None:
        """Until the informer waits for something the test has not given it yet."""
        await asyncio.wait_for(self._idle.wait(), timeout)


async def until(cond: Callable[[], bool], timeout: float = 10.0) -> None:
    """Poll ``cond`` on the event loop until it holds; fail after ``timeout`` seconds."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not cond():
        if loop.time() > deadline:
            raise AssertionError("condition not reached in time")
        await asyncio.sleep(0.001)


@contextlib.asynccontextmanager
async def running(informer: Informer[Any]) -> AsyncIterator[asyncio.Task[None]]:
    task = asyncio.create_task(informer.run())
    try:
        yield task
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
