"""An informer with a label selector (client-go's ``ListOptions.LabelSelector``) against the simulated
cluster: every LIST page and watch carries it, so only the matching objects are listed, watched and cached;
an object relabelled into the selection arrives as added, one relabelled out of it leaves as deleted (the
apiserver's watch filter), and a relist keeps only the matching ones."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from app.kube.informer import Informer
from app.trainer.kinds import TRAINJOBS
from tests.support.informer_fakes import Projector
from tests.support.informer_sim_env import Env, informer_env, job, options
from tests.support.waiting import eventually

SELECTED = "example.com/selected"


@pytest.fixture
async def env(tmp_path: Path) -> AsyncIterator[Env]:
    async with informer_env(tmp_path, Env) as e:
        yield e


def labelled(name: str, labels: dict[str, str] | None) -> dict[str, Any]:
    obj = job(name)
    if labels is not None:
        obj["metadata"]["labels"] = labels
    return obj


def start(env: Env, page_size: int = 2) -> Informer[Any]:
    env.informer = Informer(
        env.client,
        TRAINJOBS,
        None,
        Projector(),
        env.recorder,
        options=options(page_size=page_size),
        label_selector=SELECTED,
    )
    env.task = asyncio.create_task(env.informer.run())
    return env.informer


async def test_only_objects_with_the_label_are_listed_watched_and_cached(env: Env) -> None:
    store = env.sim.store
    for i in range(5):
        store.create(TRAINJOBS, "team1", labelled(f"in-{i}", {SELECTED: str(i)}))
        store.create(TRAINJOBS, "team1", labelled(f"out-{i}", {"other": "x"}))
    inf = start(env)
    await env.watching()
    assert sorted(inf.keys()) == [f"team1/in-{i}" for i in range(5)]  # over three pages of two
    store.create(TRAINJOBS, "team2", labelled("plain", None))
    store.create(TRAINJOBS, "team2", labelled("in-late", {SELECTED: ""}))
    await eventually(lambda: inf.get("team2/in-late") is not None, what="the new labelled object")
    assert inf.get("team2/plain") is None
    # Relabelled out of the selection: deleted; into it: added.
    obj = store.get(TRAINJOBS, "team1", "in-0")
    obj["metadata"]["labels"] = {}
    store.update(TRAINJOBS, "team1", obj)
    obj = store.get(TRAINJOBS, "team1", "out-0")
    obj["metadata"]["labels"][SELECTED] = "now"
    store.update(TRAINJOBS, "team1", obj)
    await eventually(
        lambda: inf.get("team1/in-0") is None and inf.get("team1/out-0") is not None,
        what="the relabelled objects",
    )
    # A relist (the watch cache restarted above a compaction: 410) keeps the selection.
    store.create(TRAINJOBS, "team1", labelled("in-after", {SELECTED: "x"}))
    env.sim.faults.compact()
    env.sim.faults.restart()
    await eventually(lambda: inf.counters.relists["expired"] >= 1, what="a relist")
    await env.watching()
    selected = {
        f"{e.key[0]}/{e.key[1]}"
        for e in store.entries(TRAINJOBS, None)
        if SELECTED in (e.obj["metadata"].get("labels") or {})
    }
    assert set(inf.keys()) == selected and "team1/in-after" in selected
