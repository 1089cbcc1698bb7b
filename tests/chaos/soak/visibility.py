"""Which countable edges no replica could observe (each replica's span of the TrainJob stream and of the pods
stream), and which pod failures a replica saw without their TrainJob (``unjoined``: not counted by it)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from kubesim.trainer.truth_pods import failed_pod_key, trainjob_of
from tests.chaos.soak.ledger import (
    ACCEL_COUNT,
    CREATED,
    FINISHED,
    LIFETIME_COUNT,
    NODES_COUNT,
    POD_FAILURES,
    Values,
)
from tests.chaos.tap import Record

POD_STREAM = "pods/"


@dataclass
class Span:
    """What one replica (one instance) could observe of one stream (the TrainJobs', ``""``, or the pods',
    ``"pods/"``), in resourceVersions."""

    identity: str
    stream: str = ""
    initial_rv: int | None = None  # its initial list: edges at or below it are never counted by it
    stop_rv: int | None = None  # the rv its informer had reached when it stopped
    relists: list[tuple[int, int]] = field(default_factory=list)  # (rv held before, list rv)
    rv_now: Callable[[], int] | None = None  # its informer's rv while it runs

    def hides(self, edge_rv: int, deleted_rv: int | None) -> bool:
        """True if this replica could not have seen the edge: before its initial list, after it stopped, or
        the edge and the job's deletion both inside one relist gap (the diff shows neither)."""
        if self.initial_rv is None or edge_rv <= self.initial_rv:
            return True
        if self.stop_rv is not None and edge_rv > self.stop_rv:
            return True
        return deleted_rv is not None and any(
            before < edge_rv and deleted_rv <= listed for before, listed in self.relists
        )

    def current_rv(self) -> int:
        if self.stop_rv is not None:
            return self.stop_rv
        return self.rv_now() if self.rv_now is not None else 0

    def record(self, record: Record) -> None:
        """An ``initial`` or ``relist`` record of its informer of this stream."""
        if record["k"] == "initial":
            self.initial_rv = record["rv"]
        else:
            self.relists.append((record["before"], record["listed"]))


# uid -> [created rv, created series, terminal rv, finished series, deleted rv]
_Edges = list[Any]


class Visibility:
    """Which countable edges no replica could observe.

    A list+watch client sees a TrainJob's creation or terminal write unless the job is also deleted before
    the client's next successful list while its watch is down (a relist diff has nothing to show for it).
    An edge hidden from every replica that ran is not countable by any leader; the report excludes exactly
    those from the truth, and says how many. Everything is keyed by resourceVersion, not by time."""

    def __init__(self) -> None:
        self.spans: list[Span] = []
        self.edges: dict[str, _Edges] = {}
        # pod uid -> [failed rv, the pod_failures series, None, None, deleted rv] (the layout of ``edges``)
        self.pod_edges: dict[str, _Edges] = {}
        # pod uid -> (replicas that saw it fail with its TrainJob cached, those that saw it without)
        self.pod_seen: dict[str, tuple[set[str], set[str]]] = {}
        # pod uid -> replicas whose first list had it Failed while its TrainJob was not cached
        self.listed_unjoined: dict[str, set[str]] = {}
        # Failed pods found in a replica's first pods list, with or without their TrainJob: uid -> identities
        # (a successor that did not find an at-risk failure there never could: "uncovered", report.py).
        self.listed: dict[str, set[str]] = {}
        self.dropped_visible = 0

    def attach_truth(self, truth: Any) -> None:
        created, written, deleted = truth.job_created, truth.job_written, truth.job_deleted
        pod_written_before = truth.pod_written

        def job_created(job: Any, *, malformed: bool = False) -> None:
            created(job, malformed=malformed)
            meta = job.get("metadata") or {}
            uid = str(meta.get("uid", ""))
            req = truth.requests.get(uid)
            if req is not None:
                series = [
                    (CREATED, (req.namespace, req.runtime_ref)),
                    (NODES_COUNT, (req.runtime_ref,)),
                    *[(ACCEL_COUNT, (req.runtime_ref,)) for _ in req.accelerators],
                ]
                self.edges[uid] = [_int_rv(meta), series, None, None, None]

        def job_written(job: Any) -> None:
            meta = job.get("metadata") or {}
            uid = str(meta.get("uid", ""))
            had = uid in truth.terminal
            written(job)
            edges = self.edges.get(uid)
            fin = truth.terminal.get(uid)
            if not had and fin is not None and edges is not None:
                edges[2] = _int_rv(meta)
                edges[3] = [
                    (FINISHED, (fin.result, fin.reason, fin.runtime_ref)),
                    (LIFETIME_COUNT, (fin.result, fin.runtime_ref)),
                ]

        def job_deleted(uid: str, resource_version: int = 0) -> None:
            deleted(uid, resource_version)
            edges = self.edges.get(uid)
            if edges is not None:
                edges[4] = resource_version

        def pod_written(pod: Any) -> None:
            meta = pod.get("metadata") or {}
            uid = str(meta.get("uid", ""))
            had = uid in truth._failed_pods
            pod_written_before(pod)
            if had or uid not in truth._failed_pods:
                return
            owner = trainjob_of(pod)
            entry = truth._by_name.get(owner) if owner is not None else None
            key = failed_pod_key(pod, entry[1] if entry is not None else None)
            if key is not None:
                self.pod_edges[uid] = [_int_rv(meta), [(POD_FAILURES, key)], None, None, None]

        truth.job_created, truth.job_written, truth.job_deleted = job_created, job_written, job_deleted
        truth.pod_written = pod_written

    def pod_deleted(self, uid: str, resource_version: int) -> None:
        """A pod is gone from the store (the generator's, or a namespace's deletion)."""
        edges = self.pod_edges.get(uid)
        if edges is not None:
            edges[4] = resource_version

    def saw_pod(self, identity: str, record: Record) -> None:
        """A ``pod_seen`` record: ``identity`` saw the pod fail, with or without its TrainJob cached; or, with
        ``listed``, found it already Failed in its first list (only one without its TrainJob is kept: it
        matters only if that replica takes over from a floor below it, ``listed_unjoined``)."""
        uid = str(record["pod"])
        if record.get("listed"):
            self.listed.setdefault(uid, set()).add(identity)
            if not record["joined"]:
                self.listed_unjoined.setdefault(uid, set()).add(identity)
            return
        joined, unjoined = self.pod_seen.setdefault(uid, (set(), set()))
        (joined if record["joined"] else unjoined).add(identity)

    def unjoined(self, after_rv: int) -> tuple[Values, Values, dict[str, int]]:
        """Pod failures some replica saw while it did not cache their TrainJob (app/trainer/pod_failures.py:
        not counted by it): (series -> count to take off the truth, series -> allowance, counts). Seen so by
        every replica that saw it: no leader counts it. By some only: a leader may count it or not (the
        leader then may not have been one that saw it joined), so it is allowed once but not required. Only
        failures above ``after_rv`` (the truth's start) that some replica could observe."""
        off: Values = {}
        allowance: Values = {}
        counts = {"unjoined_everywhere": 0, "unjoined_somewhere": 0}
        for uid, (joined, unjoined) in self.pod_seen.items():
            edges = self.pod_edges.get(uid)
            if not unjoined or edges is None or edges[0] <= after_rv:
                continue
            if edges[4] is not None and self.hidden_from_all(edges[0], edges[4], POD_STREAM):
                continue  # taken off as unobservable already
            counts["unjoined_somewhere" if joined else "unjoined_everywhere"] += 1
            for name, key in edges[1]:
                off.setdefault(name, {})[key] = off.get(name, {}).get(key, 0) + 1
                if joined:
                    allowance.setdefault(name, {})[key] = allowance.get(name, {}).get(key, 0) + 1
        return off, allowance, counts

    def span(self, identity: str, rv_now: Callable[[], int], stream: str = "") -> Span:
        span = Span(identity, stream, rv_now=rv_now)
        self.spans.append(span)
        return span

    def stopped(self, span: Span) -> None:
        span.stop_rv = span.current_rv()
        span.rv_now = None

    def hidden_from_all(self, edge_rv: int, deleted_rv: int | None, stream: str = "") -> bool:
        return all(span.hides(edge_rv, deleted_rv) for span in self.spans if span.stream == stream)

    def prune(self) -> None:
        """Forget deleted jobs and pods whose edges some replica has provably seen (bounded memory); a pod
        some replica saw without its TrainJob is kept (``unjoined``)."""
        for edges, stream in ((self.edges, ""), (self.pod_edges, POD_STREAM)):
            for uid in [u for u, e in edges.items() if e[4] is not None]:
                e = edges[uid]
                deleted_rv = e[4]
                if stream and (self.pod_seen.get(uid, (set(), set()))[1] or uid in self.listed_unjoined):
                    continue
                if all(
                    rv is None
                    or any(
                        s.stream == stream
                        and not s.hides(rv, deleted_rv)
                        and s.current_rv() >= deleted_rv
                        and s.initial_rv is not None
                        for s in self.spans
                    )
                    for rv in (e[0], e[2])
                ):
                    del edges[uid]
                    self.pod_seen.pop(uid, None)
                    self.dropped_visible += 1

    def unobservable(self, after_rv: int) -> tuple[Values, dict[str, int], list[str]]:
        """Edges above ``after_rv`` (the truth's start): (series -> count to take off the truth, counts per
        edge kind, some of the uids)."""
        out: Values = {}
        counts = {"created": 0, "finished": 0, "pod_failed": 0}
        uids: list[str] = []
        all_edges = [(uid, e, "") for uid, e in self.edges.items()]
        all_edges += [(uid, e, POD_STREAM) for uid, e in self.pod_edges.items()]
        for uid, edges, stream in all_edges:
            created_rv, created_series, terminal_rv, finished_series, deleted_rv = edges
            if deleted_rv is None:
                continue  # still there at the end: every replica's cache has it
            for kind, rv, series in (
                ("pod_failed" if stream else "created", created_rv, created_series),
                ("finished", terminal_rv, finished_series),
            ):
                if (
                    rv is None
                    or series is None
                    or rv <= after_rv
                    or not self.hidden_from_all(rv, deleted_rv, stream)
                ):
                    continue
                counts[kind] += 1
                if len(uids) < 50:
                    uids.append(f"{kind} {uid} rv {rv} deleted at rv {deleted_rv}")
                for name, key in series:
                    out.setdefault(name, {})[key] = out.get(name, {}).get(key, 0) + 1
        return out, counts, uids


def _int_rv(meta: dict[str, Any]) -> int:
    try:
        return int(meta.get("resourceVersion") or 0)
    except (TypeError, ValueError):
        return 0
