"""MAX_OBJECT_BYTES on every path: an object above it is skipped on the watch *and* in LIST pages, so one
skipped on the watch does not come back at the next relist. Counted in skipped_objects{too_large} and
limit_hits{object_too_large}; the rest of the page, and the informer, carry on."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from app.kube.client import KubeClient
from app.kube.decode import Decoder
from app.kube.informer import Informer, InformerOptions
from app.trainer.kinds import TRAINJOBS
from kubesim.trainer.cluster import SimulatedCluster
from tests.support.informer_fakes import Projector, Recorder, obj
from tests.support.waiting import eventually

LIMIT = 64 * 1024  # the smallest max_object_bytes the settings allow


def page(*items: dict[str, Any], rv: str = "100") -> bytes:
    return orjson.dumps({"kind": "List", "metadata": {"resourceVersion": rv}, "items": list(items)})


def padded(item: dict[str, Any], size: int) -> dict[str, Any]:
    item["metadata"]["annotations"] = {"padding": "x" * size}
    return item


def decode(body: bytes, limit: int | None = LIMIT) -> tuple[dict[str, Any], set[str], list[tuple[Any, ...]]]:
    items: dict[str, Any] = {}
    unusable: set[str] = set()
    skipped: list[tuple[Any, ...]] = []
    rv, cont = Decoder(Projector()).page(
        body, {}, items, unusable, lambda *a: skipped.append(a), max_object_bytes=limit
    )
    assert (rv, cont) == ("100", "")
    return items, unusable, skipped


def test_oversized_object_in_a_list_page_is_skipped() -> None:
    body = page(obj("a", 1), padded(obj("big", 2), LIMIT), obj("c", 3))
    assert len(body) > LIMIT
    items, unusable, skipped = decode(body)
    assert sorted(items) == ["ns/a", "ns/c"]
    assert unusable == {"ns/big"}  # the cache keeps its last good state, if it had one
    assert skipped == [("too_large", "ns/big", "2")]


def test_page_below_the_limit_is_decoded_whole() -> None:
    body = page(obj("a", 1), padded(obj("b", 2), 1000))
    items, unusable, skipped = decode(body)
    assert sorted(items) == ["ns/a", "ns/b"] and not unusable and not skipped
    # Without a limit (the old call), nothing is measured.
    items, _, skipped = decode(page(obj("a", 1), padded(obj("big", 2), LIMIT)), limit=None)
    assert sorted(items) == ["ns/a", "ns/big"] and not skipped


def test_large_page_of_small_objects_is_all_kept() -> None:
    body = page(*(padded(obj(f"j{i}", i + 1), 2000) for i in range(60)))
    assert len(body) > LIMIT
    items, unusable, skipped = decode(body)
    assert len(items) == 60 and not unusable and not skipped


def test_malformed_item_in_a_large_page_takes_the_tolerant_path() -> None:
    broken = obj("broken", 2)
    broken["metadata"]["uid"] = 12345  # wrong type for the typed decoder; from_json refuses it too
    body = page(obj("a", 1), broken, padded(obj("c", 3), LIMIT - 2000))
    items, unusable, skipped = decode(body)
    assert sorted(items) == ["ns/a", "ns/c"]
    assert skipped == [("malformed", "ns/broken", "2")] and unusable == {"ns/broken"}


# ---------------------------------------------------------------------------------------------- end to end


OPTS = InformerOptions(
    page_size=500,
    watch_timeout_range=(30, 30),
    inactivity_timeout=5.0,
    max_object_bytes=LIMIT,
    backoff_base=0.05,
    backoff_cap=0.3,
    list_timeout=5.0,
    connect_timeout=1.0,
    short_watch=0.05,
)


def trainjob(name: str, padding: int = 0) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name}
    if padding:
        meta["annotations"] = {"example.com/padding": "x" * padding}
    return {
        "apiVersion": "trainer.kubeflow.org/v1alpha1",
        "kind": "TrainJob",
        "metadata": meta,
        "spec": {"runtimeRef": {"name": "torch-distributed"}},
    }


@pytest.fixture
def sim_options() -> dict[str, Any]:
    return {"watch_timeout": (30.0, 30.0), "bookmark_interval": 0.5}  # tests/conftest.py: sim


@pytest.fixture
async def client(kubeconfig: Path) -> AsyncIterator[KubeClient]:
    kube = await KubeClient.connect(str(kubeconfig))
    try:
        yield kube
    finally:
        await kube.close()


async def test_oversized_object_stays_out_across_watch_and_relist(
    sim: SimulatedCluster, client: KubeClient
) -> None:
    cluster = sim
    cluster.store.create(TRAINJOBS, "team1", trainjob("small"))
    cluster.store.create(TRAINJOBS, "team1", trainjob("big", padding=LIMIT + 1000))
    limits: list[str] = []
    informer = Informer(
        client, TRAINJOBS, None, Projector(), Recorder(), options=OPTS, on_limit=limits.append
    )
    task = asyncio.create_task(informer.run())
    try:
        # The initial LIST skips it.
        await eventually(lambda: informer.synced and informer.watching, what="synced and watching")
        assert informer.keys() == ["team1/small"]
        assert informer.counters.skipped["too_large"] == 1
        assert limits == ["object_too_large"]
        # Changed: the watch line is too large, so the informer relists, and the LIST skips it again.
        big = cluster.store.get(TRAINJOBS, "team1", "big")
        big["spec"]["suspend"] = True
        cluster.store.update(TRAINJOBS, "team1", big)
        await eventually(lambda: informer.counters.relists["oversized_line"] == 1, what="relist")
        await eventually(lambda: informer.watching and informer.counters.skipped["too_large"] == 3)
        assert informer.keys() == ["team1/small"]
        assert limits == ["object_too_large"] * 3
        # The informer carries on with everything else.
        cluster.store.create(TRAINJOBS, "team1", trainjob("later"))
        await eventually(
            lambda: informer.get("team1/later") is not None, what="a new object after the relist"
        )
        assert sorted(informer.keys()) == ["team1/later", "team1/small"]
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
