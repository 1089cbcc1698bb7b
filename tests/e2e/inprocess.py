"""The real service app (``create_app``, as ``trainer-metrics --simulate`` builds it) served by uvicorn on a
loopback port, against a simulated cluster whose workload generator the test controls, all on an event
loop in a background thread so that synchronous tests and an external Prometheus can use it.

The only difference from ``app.replica.simulate.embedded_cluster``: the generator is started by the test once
the service leads (so its ground truth of "created" and "finished" starts exactly where the service's counters
start), and stopped by the test (so the stream can settle before comparing)."""

from __future__ import annotations

import asyncio
import contextlib
import tempfile
import threading
from collections.abc import AsyncIterator, Callable
from concurrent.futures import Future
from pathlib import Path
from typing import Any, TypeVar

import uvicorn

from app.config import Settings
from app.main import create_app
from kubesim.trainer.cluster import SimulatedCluster
from kubesim.trainer.generator import WorkloadGenerator
from kubesim.trainer.truth_records import TruthSnapshot
from tests.support.prom import SCRAPE_INTERVAL_SECONDS
from tests.support.waiting import eventually
from tests.support.workload import drive

T = TypeVar("T")

ASGIApp = Callable[..., Any]


class MetricsRequestRecorder:
    """ASGI wrapper that records, for each ``/metrics`` request, the request's Accept and Accept-Encoding
    and the response's Content-Type and Content-Encoding: what Prometheus asked for and what it got."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self.requests: list[dict[str, str]] = []

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope.get("path") != "/metrics":
            await self.app(scope, receive, send)
            return
        headers = {k.decode().lower(): v.decode() for k, v in scope.get("headers", [])}
        record = {
            "user_agent": headers.get("user-agent", ""),
            "accept": headers.get("accept", ""),
            "accept_encoding": headers.get("accept-encoding", ""),
        }

        async def recording_send(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                out = {k.decode().lower(): v.decode() for k, v in message.get("headers", [])}
                record["status"] = str(message["status"])
                record["content_type"] = out.get("content-type", "")
                record["content_encoding"] = out.get("content-encoding", "")
                self.requests.append(record)
            await send(message)

        await self.app(scope, receive, recording_send)


class InProcessService:
    def __init__(self, *, seed: int, max_jobs: int, populate: int, time_warp: float) -> None:
        self.seed = seed
        self.max_jobs = max_jobs
        self.populate = populate
        self.time_warp = time_warp
        self.port = 0
        self.runtime_refs: list[str] = []
        self.generator: WorkloadGenerator | None = None
        self.recorder: MetricsRequestRecorder | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._shutdown: asyncio.Event | None = None
        self._gen_stop: asyncio.Event | None = None
        self._gen_task: asyncio.Task[int] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    # --- lifecycle (called from the test thread) -----------------------------------------------------------
    def start(self, timeout: float = 60.0) -> None:
        self._thread = threading.Thread(target=self._run, name="e2e service", daemon=True)
        self._thread.start()
        if not self._ready.wait(timeout):
            raise AssertionError(f"the service did not start within {timeout}s")
        if self._error is not None:
            raise AssertionError(f"the service failed to start: {self._error!r}") from self._error

    def stop(self, timeout: float = 30.0) -> None:
        if self._loop is not None and self._shutdown is not None and not self._loop.is_closed():
            with contextlib.suppress(RuntimeError):  # loop already closed
                self._loop.call_soon_threadsafe(self._shutdown.set)
        if self._thread is not None:
            self._thread.join(timeout)
            assert not self._thread.is_alive(), "the service thread did not stop"

    def call(self, fn: Callable[[], T], timeout: float = 30.0) -> T:
        """Run ``fn`` on the service's event loop (the generator and store are not thread-safe)."""
        assert self._loop is not None

        async def run() -> T:
            return fn()

        future: Future[T] = asyncio.run_coroutine_threadsafe(run(), self._loop)
        return future.result(timeout)

    def start_generator(self, rate: float, *, lifecycles: bool = False) -> TruthSnapshot:
        """Start the workload (tests.support.workload.drive); returns the truth just before its first step."""

        def go() -> TruthSnapshot:
            assert self.generator is not None and self._gen_task is None
            before = self.generator.snapshot()
            self._gen_stop = asyncio.Event()
            work = drive(self.generator, rate, self._gen_stop, lifecycles=lifecycles)
            self._gen_task = asyncio.create_task(work, name="e2e generator")
            return before

        return self.call(go)

    def stop_generator(self) -> int:
        """Stop the workload and wait for its task; returns the steps it ran."""
        assert self._loop is not None

        async def halt() -> int:
            assert self._gen_stop is not None and self._gen_task is not None
            self._gen_stop.set()
            return await self._gen_task

        return asyncio.run_coroutine_threadsafe(halt(), self._loop).result(30)

    def truth(self) -> TruthSnapshot:
        return self.call(lambda: self.gen().snapshot())

    def gen(self) -> WorkloadGenerator:
        assert self.generator is not None
        return self.generator

    # --- the event loop thread -----------------------------------------------------------------------------
    def _run(self) -> None:
        try:
            asyncio.run(self._main())
        except BaseException as exc:
            self._error = exc
        finally:
            self._ready.set()

    async def _main(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._shutdown = asyncio.Event()

        @contextlib.asynccontextmanager
        async def cluster(settings: Settings) -> AsyncIterator[str]:
            # As app.replica.simulate.embedded_cluster, less the generator task (the test drives it).
            with tempfile.TemporaryDirectory(prefix="trainer-metrics-e2e-") as tmp:
                async with SimulatedCluster(host="127.0.0.1", port=0) as sim:
                    kubeconfig = sim.write_kubeconfig(Path(tmp) / "kubeconfig")
                    self.generator = WorkloadGenerator(
                        sim.store, seed=self.seed, max_jobs=self.max_jobs, time_warp=self.time_warp
                    )
                    self.runtime_refs = self.generator.load_runtimes()
                    self.generator.populate(self.populate)  # in the service's initial list
                    try:
                        yield str(kubeconfig)
                    finally:
                        if self._gen_stop is not None and self._gen_task is not None:
                            self._gen_stop.set()
                            self._gen_task.cancel()
                            with contextlib.suppress(asyncio.CancelledError):
                                await self._gen_task

        settings = Settings(
            host="127.0.0.1",
            port=0,
            simulate=True,
            identity="trainer-metrics-e2e-0",
            lease_namespace="default",
            # Born at zero for two scrape intervals of the test's Prometheus, as the chart sets it.
            zero_hold_seconds=2.0 * SCRAPE_INTERVAL_SECONDS,
        )
        self.recorder = MetricsRequestRecorder(create_app(settings, cluster=cluster))
        config = uvicorn.Config(
            self.recorder, host="127.0.0.1", port=0, log_config=None, access_log=False, lifespan="on"
        )
        server = uvicorn.Server(config)
        serving = asyncio.create_task(server.serve(), name="e2e uvicorn")

        def started() -> bool:
            if serving.done():
                serving.result()
                raise RuntimeError("uvicorn exited during start-up")
            return bool(server.started)

        try:
            await eventually(started, timeout=60, what="uvicorn to start serving")
            self.port = int(server.servers[0].sockets[0].getsockname()[1])
            self._ready.set()
            await self._shutdown.wait()
        finally:
            server.should_exit = True
            await serving
