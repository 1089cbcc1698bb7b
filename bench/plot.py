"""``python -m bench --plot``: PNGs of a run, drawn with matplotlib (headless, the "Agg" backend).

- ``bench-memory.png``: service RSS after sync against TrainJobs (log x);
- ``bench-sync.png``: process start → ``/readyz`` 200 against TrainJobs (log-log);
- ``bench-scrape-p99.png``: ``/metrics`` p99, text 0.0.4 + gzip and OpenMetrics + gzip, against TrainJobs;
- ``bench-p5-stalls.png``: P5's event-loop stalls under the firehose, service vs the control, log-binned.

Pure: :func:`draw` reads only the run's notes and figures (``Results.notes`` and the figures as
``Figure.as_dict()`` gives them, i.e. what benchmarks.json holds) and returns the files it wrote; a plot
without data (``--only P5`` has no size sweep) is skipped. ``python -m bench.plot DIR/benchmarks.json``
redraws a saved run into DIR (or ``--output``).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

MEMORY, SYNC, SCRAPE, STALLS = (
    "bench-memory.png",
    "bench-sync.png",
    "bench-scrape-p99.png",
    "bench-p5-stalls.png",
)
PLOTS = (MEMORY, SYNC, SCRAPE, STALLS)
_DPI = 110


def draw(
    notes: Mapping[str, Any], figures: Mapping[str, Mapping[str, Any]], out_dir: Path, *, subtitle: str = ""
) -> list[Path]:
    """Writes the plots there is data for into ``out_dir``; returns their paths, in :data:`PLOTS` order."""
    import matplotlib

    matplotlib.use("Agg")  # no display on the bench host; must precede pyplot's import
    import matplotlib.pyplot as plt

    out_dir.mkdir(parents=True, exist_ok=True)
    points: list[Mapping[str, Any]] = list(notes.get("scaling") or [])
    stalls: Mapping[str, Any] = notes.get("p5_stalls") or {}
    # (file, whether there is data for it, what draws it on one axis; None: the two-panel stall plot)
    drawers: tuple[tuple[str, bool, Callable[[Any], None] | None], ...] = (
        (MEMORY, bool(points), lambda ax: _memory(ax, points, figures)),
        (SYNC, bool(points), lambda ax: _sync(ax, points)),
        (SCRAPE, bool(points), lambda ax: _scrape(ax, points)),
        (STALLS, bool(stalls.get("reps")), None),
    )
    written = []
    for name, has_data, one_axis in drawers:
        if not has_data:
            continue
        if one_axis is None:
            fig, axes = plt.subplots(1, 2, figsize=(12, 5), layout="constrained")  # suptitle clear of both
            _stalls(axes[0], axes[1], stalls)
            fig.suptitle(_title("P5: event-loop stalls under the firehose, service vs control", subtitle))
        else:
            fig, ax = plt.subplots(figsize=(8, 5), layout="constrained")
            one_axis(ax)
            _size_axis(ax, points)
            ax.set_title(_title(ax.get_title(), _sweep_note(points), subtitle), fontsize="medium")
            ax.grid(alpha=0.3, which="both")
        path = out_dir / name
        fig.savefig(path, dpi=_DPI, bbox_inches="tight")
        plt.close(fig)
        written.append(path)
    return written


def subtitle(meta: Mapping[str, Any]) -> str:
    """The run a plot comes from (its date, and whether quick mode's small sizes), from the report's meta."""
    return str(meta.get("date", "")) + (", quick mode (small sizes)" if meta.get("quick") else "")


def _title(*parts: str) -> str:
    return "\n".join(p for p in parts if p)


def _sweep_note(points: Sequence[Mapping[str, Any]]) -> str:
    """Where the points come from; P8 synced twice (paginated LIST, streaming list): say which is drawn."""
    sources = ", ".join(f"{p['trainjobs']:,}: {p['source']}" for p in points)
    return f"TrainJobs: {sources}"


def _size_axis(ax: Any, points: Sequence[Mapping[str, Any]]) -> None:
    """TrainJobs on a log axis, ticked at the sizes measured ("100,001", not "10^5"), and plain numbers on a
    log y axis ("0.5", not "5x10^-1")."""
    from matplotlib.ticker import FuncFormatter, NullFormatter

    ax.set_xscale("log")
    ax.set_xticks([int(p["trainjobs"]) for p in points])
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:,.0f}"))
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.set_xlabel("TrainJobs")
    if ax.get_yscale() == "log":
        plain = FuncFormatter(lambda v, _: f"{v:g}")
        ax.yaxis.set_major_formatter(plain)
        lo, hi = ax.get_ylim()
        # Within about a decade there are too few major ticks to read by; over several, 2-9 would crowd.
        ax.yaxis.set_minor_formatter(plain if hi / lo < 30 else NullFormatter())


def _xy(points: Sequence[Mapping[str, Any]], key: str) -> tuple[list[int], list[float]]:
    kept = [p for p in points if p.get(key) is not None]
    return [int(p["trainjobs"]) for p in kept], [float(p[key]) for p in kept]


def _label_points(ax: Any, xs: Sequence[float], ys: Sequence[float], fmt: str) -> None:
    for x, y in zip(xs, ys, strict=True):
        ax.annotate(fmt.format(y), (x, y), textcoords="offset points", xytext=(4, 6), fontsize="small")


def _memory(ax: Any, points: Sequence[Mapping[str, Any]], figures: Mapping[str, Mapping[str, Any]]) -> None:
    xs, ys = _xy(points, "rss_mib")
    ax.plot(xs, ys, marker="o", label="service RSS after sync")
    _label_points(ax, xs, ys, "{:,.0f}")
    zero = figures.get("p3_rss_zero")
    if zero and zero.get("runs"):  # what the process costs before any TrainJob: the floor of the curve
        ax.axhline(zero["median"] / 2**20, linestyle=":", color="grey", label="RSS with 0 TrainJobs")
    ax.set_ylabel("RSS (MiB)")
    ax.set_title("Service memory after sync")
    ax.legend(loc="upper left", fontsize="small")


def _sync(ax: Any, points: Sequence[Mapping[str, Any]]) -> None:
    xs, ys = _xy(points, "ready_s")
    ax.plot(xs, ys, marker="o", label="process start → /readyz 200")
    _label_points(ax, xs, ys, "{:.2f} s")
    if len(xs) > 1:  # linear through the largest point: what a sync costing O(TrainJobs) would do
        ax.plot(
            xs,
            [ys[-1] * x / xs[-1] for x in xs],
            linestyle="--",
            color="grey",
            label="∝ TrainJobs (reference)",
        )
    ax.set_yscale("log")
    ax.set_ylabel("seconds")
    ax.set_title("Sync time")
    ax.legend(loc="best", fontsize="small")


def _scrape(ax: Any, points: Sequence[Mapping[str, Any]]) -> None:
    for key, label in (
        ("p99_text_ms", "text 0.0.4 + gzip"),
        ("p99_openmetrics_ms", "OpenMetrics (Prometheus' default Accept) + gzip"),
    ):
        xs, ys = _xy(points, key)
        ax.plot(xs, ys, marker="o", label=label)
        _label_points(ax, xs, ys, "{:.1f}")
    ax.axhline(10.0, linestyle=":", color="red", label="P4 target: p99 ≤ 10 ms")
    ax.set_yscale("log")
    ax.set_ylabel("/metrics p99 (ms)")
    ax.set_title("/metrics p99 (sequential scrapes, keep-alive)")
    ax.legend(loc="upper left", fontsize="small")


def _stalls(hist_ax: Any, tail_ax: Any, stalls: Mapping[str, Any]) -> None:
    """Left: share of 1 ms wake-ups per log bucket; right: share later than x (the tail the max comes from).
    Every repetition's counts are summed: the buckets are the same (bench/common.STALL_EDGES_MS)."""
    edges = [float(e) for e in stalls["edges_ms"]]
    reps: Sequence[Mapping[str, Any]] = stalls["reps"]
    for who, color in (("service", "tab:blue"), ("control", "tab:orange")):
        counts = [sum(int(r[who]["histogram"][i]) for r in reps) for i in range(len(edges) + 1)]
        total = sum(counts)
        if not total:
            continue
        worst = max(float(r[who]["max_ms"]) for r in reps)
        label = f"{who} ({total:,} samples, {len(reps)} rep(s), max {worst:.1f} ms)"
        # Buckets 1..n-1 lie between the edges; below 0.05 ms (on time) and at/above 100 ms are left out here.
        hist_ax.stairs([c / total for c in counts[1:-1]], edges, color=color, label=label)
        # Share of samples at or above edges[i]: everything in the buckets after index i.
        later = [sum(counts[i + 1 :]) / total for i in range(len(edges))]
        tail_ax.step(edges, later, where="post", color=color, label=label)
    for ax in (hist_ax, tail_ax):
        ax.axvline(5.0, linestyle=":", color="red", label="5 ms (P5 target: longest stall)")
        ax.set_xscale("log")
        ax.set_yscale("log", nonpositive="mask")
        ax.set_xlabel("wake-up lag of a 1 ms sleep (ms)")
        ax.grid(alpha=0.3, which="both")
    hist_ax.set_ylabel("share of wake-ups in the bucket")
    hist_ax.set_title("distribution (log buckets, ~10 per decade)", fontsize="medium")
    tail_ax.set_ylabel("share of wake-ups at least this late")
    tail_ax.set_title("tail (1 - CDF)", fontsize="medium")
    tail_ax.legend(loc="lower left", fontsize="small")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.plot", description="Redraw a saved run's plots.")
    p.add_argument("json", type=Path, help="a benchmarks.json written by python -m bench")
    p.add_argument("--output", type=Path, default=None, help="directory (default: img/ beside the JSON)")
    args = p.parse_args(argv)
    run = json.loads(args.json.read_text(encoding="utf-8"))
    out = args.output or args.json.parent / "img"  # where python -m bench --plot draws them
    written = draw(run.get("notes", {}), run.get("figures", {}), out, subtitle=subtitle(run))
    print("plots: " + (", ".join(str(w) for w in written) or "none (no data)"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
