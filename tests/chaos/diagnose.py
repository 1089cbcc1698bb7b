"""Per-uid diagnosis of the chaos soak: which countable edges were lost, and why.

``.venv/bin/python -m tests.chaos.diagnose --seconds 100 [--json out.json]`` runs the soak
(tests/chaos/soak/) with extra recording:

* the truth per uid: rv and time of its creation, terminal write and deletion (wrapping the generator's
  truth);
* per replica: every countable event its TrainerState emitted (wrapping ``CountJournal.on_countable``) and
  what the journal did with it (counted live, skipped as <= floor, journalled while following), and what each
  ``start_leading`` replayed or left as <= floor;
* per replica and TrainJob informer: every Replace (relist) with the rv it held before and the list rv, every
  backoff sleep, every watch and its end reason;
* leader terms (from the soak's recorder) and the fault episodes.

Then every (uid, edge) of the truth that no leader counted is classified:

* ``invisible_to_all``: every replica alive at the time had the edge inside a relist gap (edge rv and the
  job's deletion rv both between the rv the informer held and the rv of its next list) or started after it;
  no list+watch client could have counted it;
* ``leader_gap_follower_saw``: the leader of the moment had it inside a relist gap, a follower emitted it
  but never counted it (it did not take over, or took over with a floor above the edge);
* ``skipped_le_floor``: emitted by the leader but skipped as at or below the take-over floor;
* ``journalled_not_replayed``: emitted while nobody led (or by a follower), not replayed at the take-over;
* ``other``: anything else (listed in full).

Edges counted more than once are named by the soak itself (``DoubleCounts`` in tests/chaos/soak/doubles.py,
``doubles_by_cause`` and ``doubles_not_crash_bound`` in the report).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

from app.handover.journal import CountJournal
from app.replica.service import Service
from app.trainer.events import JobCreated, JobFinished
from tests.chaos.replicas import InProcessReplica
from tests.chaos.soak.config import SoakConfig
from tests.chaos.soak.runner import Soak
from tests.chaos.soak.table import render_table


class Diagnosis:
    def __init__(self, t0: float) -> None:
        self.t0 = t0
        # uid -> facts
        self.jobs: dict[str, dict[str, Any]] = {}
        # (identity, kind, uid) -> list of emission records
        self.emitted: list[dict[str, Any]] = []
        self.replays: list[dict[str, Any]] = []
        self.relists: list[dict[str, Any]] = []
        self.sleeps: list[dict[str, Any]] = []
        self.watches: list[dict[str, Any]] = []
        self.lives: dict[str, list[float | None]] = {}  # identity -> [started, stopped]
        self.store_rv: Any = None

    def t(self) -> float:
        return round(time.monotonic() - self.t0, 3)

    def rv(self) -> int:
        return int(self.store_rv())

    # -- truth --
    def attach_truth(self, truth: Any) -> None:
        orig_created, orig_written, orig_deleted = truth.job_created, truth.job_written, truth.job_deleted

        def job_created(job: Any, *, malformed: bool = False) -> None:
            meta = job.get("metadata") or {}
            uid = str(meta.get("uid", ""))
            self.jobs[uid] = {
                "ns": meta.get("namespace"),
                "created_t": self.t(),
                "created_rv": int(meta.get("resourceVersion") or 0),
            }
            orig_created(job, malformed=malformed)

        def job_written(job: Any) -> None:
            meta = job.get("metadata") or {}
            uid = str(meta.get("uid", ""))
            had = uid in truth.terminal
            orig_written(job)
            if not had and uid in truth.terminal:
                rec = self.jobs.setdefault(uid, {})
                rec["terminal_t"] = self.t()
                rec["terminal_rv"] = int(meta.get("resourceVersion") or 0)

        def job_deleted(uid: str, resource_version: int = 0) -> None:
            orig_deleted(uid, resource_version)
            rec = self.jobs.setdefault(uid, {})
            rec["deleted_t"] = self.t()
            rec["deleted_rv"] = resource_version

        truth.job_created, truth.job_written, truth.job_deleted = job_created, job_written, job_deleted

    # -- replicas --
    def attach_service(self, service: Service) -> None:
        identity = service.settings.identity
        self.lives[identity] = [self.t(), None]
        journal: CountJournal = service.journal
        orig_on, orig_start = journal.on_countable, journal.start_leading

        def on_countable(event: Any) -> None:
            leading = journal.leading
            orig_on(event)
            if not isinstance(event, JobCreated | JobFinished):
                return  # histograms only (time to running, admission wait): not what is diagnosed here
            counted = journal._journal[-1].counted if journal._journal else None
            self.emitted.append(
                {
                    "t": self.t(),
                    "who": identity,
                    "kind": "created" if isinstance(event, JobCreated) else "finished",
                    "uid": event.uid,
                    "rv": event.rv,
                    "leading": leading,
                    "counted": counted,
                    "floor": dict(journal._floors) if journal._floors is not None else None,
                }
            )

        def start_leading(previous: Any) -> int:
            before = {id(e): e.counted for e in journal._journal}
            n = orig_start(previous)
            replayed, left = [], []
            for e in journal._journal:
                if not isinstance(e.event, JobCreated | JobFinished):
                    continue
                kind = "created" if isinstance(e.event, JobCreated) else "finished"
                item = (kind, e.event.uid, e.event.rv)
                if not before.get(id(e), True) and e.counted:
                    replayed.append(item)
                elif not e.counted:
                    left.append(item)
            self.replays.append(
                {
                    "t": self.t(),
                    "who": identity,
                    "previous": previous,
                    "replayed": replayed,
                    "left": left,
                    "journal_len": len(journal._journal),
                    "overflowed": journal.overflowed,
                }
            )
            return n

        journal.on_countable = on_countable  # type: ignore[method-assign]
        journal.start_leading = start_leading  # type: ignore[method-assign,assignment]
        for inf in service._trainjob_informers:
            self.attach_informer(identity, inf)

    def attach_informer(self, identity: str, inf: Any) -> None:
        orig_replace, orig_sleep, orig_watch = (
            inf._ingest.replace,
            inf._reflector._sleep,
            inf._reflector._watch,
        )

        def replace(items: Any, list_rv: str, unusable: Any) -> None:
            before = inf.resource_version
            self.relists.append(
                {
                    "t": self.t(),
                    "who": identity,
                    "initial": not inf.synced,
                    "from_rv": int(before or 0),
                    "list_rv": int(list_rv or 0),
                    "store_rv": self.rv(),
                }
            )
            orig_replace(items, list_rv, unusable)

        async def sleep(delay: float) -> None:
            self.sleeps.append(
                {
                    "t": self.t(),
                    "who": identity,
                    "delay": round(delay, 3),
                    "step": inf._reflector._backoff.step,
                }
            )
            await orig_sleep(delay)

        async def watch() -> Any:
            start = self.t()
            rv = inf.resource_version
            stop = await orig_watch()
            self.watches.append(
                {
                    "who": identity,
                    "start": start,
                    "end": self.t(),
                    "from_rv": int(rv or 0),
                    "reason": stop.reason,
                    "relist": stop.relist,
                }
            )
            return stop

        inf._ingest.replace, inf._reflector._sleep, inf._reflector._watch = replace, sleep, watch

    def replica_stopped(self, identity: str) -> None:
        if identity in self.lives:
            self.lives[identity][1] = self.t()


class DiagnosedSoak(Soak):
    def __init__(self, cfg: SoakConfig, workdir: Path) -> None:
        super().__init__(cfg, workdir)
        self.diag = Diagnosis(self.t0)

    async def start_replica(self, identity: str | None = None, *, resident: bool = False) -> str:
        ident = await super().start_replica(identity, resident=resident)
        handle = self.live[ident]
        assert isinstance(handle, InProcessReplica), "the diagnosis runs the replicas in this process"
        svc = handle.service
        self.diag.store_rv = lambda: self.sim.store.resource_version
        self.diag.attach_service(svc)
        if not hasattr(self.gen.truth, "_diag"):
            self.gen.truth._diag = True  # type: ignore[attr-defined]
            self.diag.attach_truth(self.gen.truth)
        return ident

    async def stop_replica(self, identity: str, *, kill: bool) -> None:
        await super().stop_replica(identity, kill=kill)
        self.diag.replica_stopped(identity)


def classify(soak: DiagnosedSoak, report: dict[str, Any]) -> dict[str, Any]:
    d = soak.diag
    terms = sorted(soak.recorder.terms, key=lambda t: t.started)
    counted: set[tuple[str, str]] = set()
    for e in d.emitted:
        if e["leading"] and e["counted"]:
            counted.add((e["kind"], e["uid"]))
    for r in d.replays:
        for kind, uid, _ in r["replayed"]:
            counted.add((kind, uid))
    emitted_by: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for e in d.emitted:
        emitted_by.setdefault((e["kind"], e["uid"]), []).append(e)

    def leader_at(t: float) -> str | None:
        for term in terms:
            if term.started <= t and (term.stopped is None or t <= term.stopped):
                return term.identity
        return None

    def gap_for(who: str, edge_rv: int, del_rv: int | None) -> dict[str, Any] | None:
        """The relist of ``who`` that hid this edge (edge and deletion inside its gap), if any."""
        for r in d.relists:
            if r["who"] != who:
                continue
            if r["initial"] and edge_rv <= r["list_rv"]:
                return r
            if r["from_rv"] < edge_rv and del_rv is not None and del_rv <= r["list_rv"]:
                return r
        return None

    lost: list[dict[str, Any]] = []
    for uid, job in d.jobs.items():
        if "created_rv" not in job:
            continue
        for kind in ("created", "finished"):
            rv_key = f"{kind}_rv" if kind == "created" else "terminal_rv"
            if rv_key not in job:
                continue
            if (kind, uid) in counted:
                continue
            edge_rv, edge_t = job[rv_key], job[f"{'created' if kind == 'created' else 'terminal'}_t"]
            del_rv = job.get("deleted_rv")
            alive = [
                w
                for w, (s, e) in d.lives.items()
                if s is not None and s <= edge_t and (e is None or e >= edge_t)
            ]
            hidden = {w: gap_for(w, edge_rv, del_rv) for w in alive}
            ems = emitted_by.get((kind, uid), [])
            leader = leader_at(edge_t)
            if not ems:
                cause = "invisible_to_all" if all(hidden.values()) else "never_emitted_but_visible"
            elif any(e["leading"] and not e["counted"] for e in ems):
                cause = "skipped_le_floor"
            elif leader is not None and leader not in {e["who"] for e in ems}:
                cause = "leader_gap_follower_saw"
            else:
                cause = "journalled_not_replayed"
            lost.append(
                {
                    "kind": kind,
                    "uid": uid,
                    "cause": cause,
                    "edge_rv": edge_rv,
                    "edge_t": edge_t,
                    "deleted_rv": del_rv,
                    "deleted_t": job.get("deleted_t"),
                    "life_after_edge_s": round(job["deleted_t"] - edge_t, 3) if "deleted_t" in job else None,
                    "leader": leader,
                    "alive": alive,
                    "hidden_by": {
                        w: (r and {k: r[k] for k in ("t", "initial", "from_rv", "list_rv")})
                        for w, r in hidden.items()
                    },
                    "emitted": ems,
                }
            )
    by_cause = Counter((x["kind"], x["cause"]) for x in lost)
    # Relist gaps per replica: (t, rv span, seconds since that informer's previous event).
    gaps = [{**r, "rv_span": r["list_rv"] - r["from_rv"]} for r in d.relists if not r["initial"]]
    big_sleeps = sorted(d.sleeps, key=lambda s: -s["delay"])[:15]
    return {
        "lost_total": len(lost),
        "by_cause": {f"{k}/{c}": n for (k, c), n in sorted(by_cause.items())},
        "lost": lost,
        "relists": gaps,
        "biggest_sleeps": big_sleeps,
        "sleep_total_by_replica": {
            w: round(sum(s["delay"] for s in d.sleeps if s["who"] == w), 1) for w in d.lives
        },
        "watch_ends": Counter(w["reason"] for w in d.watches),
        "replays": [
            {k: (len(v) if isinstance(v, list) else v) for k, v in r.items() if k != "previous"}
            | {"previous": str(r["previous"])}
            for r in d.replays
        ],
        "episodes": soak.episodes,
        "terms": [
            {"who": t.identity, "start": t.started, "stop": t.stopped, "floor": t.floor, "how": t.how}
            for t in terms
        ],
        "counted_report": report["counters"],
    }


async def run(cfg: SoakConfig) -> tuple[dict[str, Any], dict[str, Any]]:
    with tempfile.TemporaryDirectory() as tmp:
        soak = DiagnosedSoak(cfg, Path(tmp))
        report = await soak.run()
        return report, classify(soak, report)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.chaos.diagnose")
    parser.add_argument("--seconds", type=float, default=100.0)
    parser.add_argument("--seed", type=int, default=SoakConfig.seed)
    parser.add_argument("--warmup", type=float, default=SoakConfig.warmup_seconds)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    cfg = SoakConfig(fault_seconds=args.seconds, seed=args.seed, warmup_seconds=args.warmup)
    report, diag = asyncio.run(run(cfg))
    print(render_table(report))
    keys = ("lost_total", "by_cause", "sleep_total_by_replica", "watch_ends")
    print(json.dumps({k: diag[k] for k in keys}))
    if args.json:
        args.json.write_text(json.dumps({"report": report, "diagnosis": diag}, indent=1, default=str))
    return 0


# --- memory probe ----------------------------------------------------------------------------------


class MemorySoak(DiagnosedSoak):
    """Samples RSS, the sizes of the bounded structures and object counts by type; with ``trace_at`` set,
    tracemalloc starts then and the top growth between two later snapshots is reported."""

    def __init__(
        self, cfg: SoakConfig, workdir: Path, trace_at: float | None, points: tuple[float, float]
    ) -> None:
        super().__init__(cfg, workdir)
        self.trace_at = trace_at
        self.points = points
        self.samples: list[dict[str, Any]] = []
        self.trace_top: list[str] = []
        self.type_growth: list[tuple[str, int]] = []

    def attach_truth_noop(self) -> None:
        pass

    def structures(self) -> dict[str, Any]:
        import gc as _gc

        from app.trainer.kinds import TRAINJOBS
        from tests.chaos.soak.own_memory import rss_bytes

        store = self.sim.store
        out: dict[str, Any] = {
            "t": self.t(),
            "rss_mb": round(rss_bytes() / 2**20, 1),
            "history": len(store._history),
            "snapshots": len(store._snapshots),
            "store_jobs": len(store.list(TRAINJOBS, None)[0]),
            "readiness": len(self.readiness),
            "gc_objects": len(_gc.get_objects()),
            "diag_emitted": len(self.diag.emitted),
        }
        for ident, e in self.live.items():
            assert isinstance(e, InProcessReplica)
            svc = e.service
            out[ident] = {
                "journal": len(svc.journal._journal),
                "tombstones": svc.state.history.tombstones,
                "terminal": svc.state.terminal_count,
                "cache": sum(len(i) for i in svc.informers),
            }
        return out

    async def sample_rss(self, stop: asyncio.Event) -> None:
        import gc as _gc
        import tracemalloc

        types_at: dict[float, Counter[str]] = {}
        snaps: dict[float, Any] = {}
        pending = sorted(self.points)
        tick = 0
        while not stop.is_set():
            from tests.chaos.soak.own_memory import rss_bytes

            self.rss.append((self.t(), rss_bytes()))
            tick += 1
            if tick % 10 == 0:
                self.samples.append(self.structures())
                print("MEM", json.dumps(self.samples[-1]), flush=True)
            if self.trace_at is not None and not tracemalloc.is_tracing() and self.t() >= self.trace_at:
                tracemalloc.start(8)
            if pending and self.t() >= pending[0]:
                p = pending.pop(0)
                _gc.collect()
                types_at[p] = Counter(type(o).__name__ for o in _gc.get_objects())
                if tracemalloc.is_tracing():
                    snaps[p] = tracemalloc.take_snapshot()
                if len(types_at) == 2:
                    a, b = (types_at[x] for x in sorted(types_at))
                    self.type_growth = (b - a).most_common(25)
                    print("TYPES", self.type_growth, flush=True)
                if len(snaps) == 2:
                    a, b = (snaps[x] for x in sorted(snaps))
                    stats = b.compare_to(a, "traceback")
                    self.trace_top = []
                    for st in stats[:15]:
                        where = "\n".join(st.traceback.format()[-8:])
                        self.trace_top.append(f"{st.size_diff / 1024:.0f} KiB {st.count_diff:+d}\n{where}")
                    print("TRACE\n" + "\n---\n".join(self.trace_top), flush=True)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), 1.0)


def memory_main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.chaos.diagnose memory")
    parser.add_argument("--minutes", type=float, default=6.0)
    parser.add_argument("--trace-at", type=float, default=None)
    parser.add_argument("--points", type=float, nargs=2, default=(150.0, 330.0))
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.ERROR)
    cfg = SoakConfig(fault_seconds=args.minutes * 60, warmup_seconds=60.0)

    async def go() -> dict[str, Any]:
        with tempfile.TemporaryDirectory() as tmp:
            soak = MemorySoak(cfg, Path(tmp), args.trace_at, tuple(args.points))
            return await soak.run()

    report = asyncio.run(go())
    print(render_table(report))
    return 0


if __name__ == "__main__":  # pragma: no cover
    if sys.argv[1:2] == ["memory"]:
        sys.exit(memory_main(sys.argv[2:]))
    sys.exit(main())
