"""The pods watch's access check (app/replica/pods.py): 403 is forbidden, 404 absent, each logged once and
asked again; an answer that says nothing about access (unreachable, 5xx, 429) neither; once allowed the
informer is built and run. The TrainJob informers never wait for it (tests/integration/test_pod_series.py).
The pod series and the pod-failure edges read a pod's TrainJob in the TrainJob informer of its scope."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest

from app.kube.client import ApiError
from app.replica.pods import ABSENT, CHECKING, FORBIDDEN, WATCHING, PodWatch, TrainJobCaches
from app.trainer import rules
from tests.support.waiting import eventually


class FakeClient:
    def __init__(self, answers: list[ApiError | None]) -> None:
        self.answers = answers
        self.requests: list[tuple[str, dict[str, str]]] = []

    async def request_json(self, method: str, path: str, *, query: dict[str, str], timeout: float) -> Any:
        self.requests.append((path, query))
        answer = self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]
        if answer is not None:
            raise answer
        return {"kind": "PodList", "items": []}


class FakeInformer:
    def __init__(self) -> None:
        self.running = asyncio.Event()

    async def run(self) -> None:
        self.running.set()
        await asyncio.Event().wait()


async def watch_until(
    client: FakeClient, namespace: str | None, done: Any, monkeypatch: pytest.MonkeyPatch
) -> tuple[PodWatch, list[FakeInformer]]:
    monkeypatch.setattr("app.replica.pods._RETRY_INTERVAL", 0.01)
    built: list[FakeInformer] = []

    def make(ns: str | None) -> Any:
        built.append(FakeInformer())
        return built[-1]

    watch = PodWatch(client, namespace, make, recheck=0.01)  # type: ignore[arg-type]
    task = asyncio.create_task(watch.run())
    try:
        await eventually(lambda: done(watch, built), timeout=5, what="the watch's state")
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    return watch, built


async def test_allowed_at_once_builds_and_runs_the_informer(monkeypatch: pytest.MonkeyPatch) -> None:
    client = FakeClient([None])
    watch, built = await watch_until(client, "team-a", lambda w, b: b and b[0].running.is_set(), monkeypatch)
    assert len(built) == 1
    assert watch.status == WATCHING and watch.name == "pods/team-a"
    assert client.requests == [
        ("/api/v1/namespaces/team-a/pods", {"limit": "1", "labelSelector": rules.POD_SELECTOR})
    ]


@pytest.mark.parametrize(("status", "verdict"), [(403, FORBIDDEN), (404, ABSENT)])
async def test_refused_is_logged_once_and_asked_again_until_allowed(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, status: int, verdict: str
) -> None:
    caplog.set_level(logging.INFO, logger="app.replica.pods")
    refusal = ApiError(status, "Forbidden" if status == 403 else "NotFound", "no")
    client = FakeClient([refusal] * 5 + [None])
    seen: list[str] = []

    def done(w: PodWatch, b: list[FakeInformer]) -> bool:
        seen.append(w.status)
        return bool(b) and b[0].running.is_set()

    watch, _ = await watch_until(client, None, done, monkeypatch)
    assert verdict in seen and watch.status == WATCHING and len(client.requests) == 6
    refused = [r for r in caplog.records if verdict in r.getMessage()]
    assert len(refused) == 1 and refused[0].levelno == logging.WARNING
    assert any("may be listed now" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize("status", [0, 429, 500, 503])
async def test_answers_that_say_nothing_about_access_keep_checking(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, status: int
) -> None:
    client = FakeClient([ApiError(status, "x", "y")])
    watch, built = await watch_until(client, None, lambda w, b: len(client.requests) >= 3, monkeypatch)
    assert watch.status == CHECKING and not built
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


class CacheOf:
    """A TrainJob informer's read side: its scope and its cache by key."""

    def __init__(self, namespace: str | None, *keys: str) -> None:
        self.namespace = namespace
        self.store = {key: f"job {key}" for key in keys}

    def __len__(self) -> int:  # an Informer's: an empty cache is falsy
        return len(self.store)

    def get(self, key: str) -> Any:
        return self.store.get(key)


def test_trainjob_caches_read_the_informer_over_all_namespaces() -> None:
    caches = TrainJobCaches()
    assert caches.get("team-a", "llama") is None  # before the informers are built
    caches.read([CacheOf(None, "team-a/llama")])  # type: ignore[list-item]
    assert caches.get("team-a", "llama") == "job team-a/llama"
    assert caches.get("team-b", "llama") is None


def test_trainjob_caches_read_the_informer_of_the_pods_namespace() -> None:
    caches = TrainJobCaches()
    caches.read([CacheOf("team-a", "team-a/llama"), CacheOf("team-b")])  # type: ignore[list-item]
    assert caches.get("team-a", "llama") == "job team-a/llama"
    assert caches.get("team-b", "llama") is None  # its informer holds no such TrainJob (and is empty)
    assert caches.get("team-c", "llama") is None  # a namespace not watched
