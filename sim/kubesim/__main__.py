"""Run the simulated cluster standalone: ``python -m kubesim --port 6443 --kubeconfig out.yaml --jobs N``;
with ``--dcgm-port 9400`` also its simulated NVIDIA dcgm-exporter (``kubesim.dcgm``) for its pods' GPUs."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import signal

from kubesim.dcgm import SimulatedDcgmExporter
from kubesim.trainer.cluster import SimulatedCluster
from kubesim.trainer.generator import DEFAULT_TIME_WARP, WorkloadGenerator

log = logging.getLogger("kubesim")


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m kubesim", description="Simulated Kubernetes API")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=6443, help="0 picks a free port")
    p.add_argument("--kubeconfig", default=None, help="write a kubeconfig for the cluster here")
    p.add_argument("--token", default=None, help="require this bearer token")
    p.add_argument("--jobs", type=int, default=0, help="TrainJobs to create up front (and keep alive)")
    p.add_argument("--rate", type=float, default=0.0, help="generator steps per second after populating")
    p.add_argument("--seed", type=int, default=None)
    p.add_argument(
        "--time-warp",
        type=float,
        default=DEFAULT_TIME_WARP,
        help="simulated seconds per second of the generator's clock (lifetimes, deadlines)",
    )
    p.add_argument(
        "--unregistered-ratio",
        type=float,
        default=0.0,
        help="share of TrainJobs referring to a runtime kind the Trainer has not registered, as stored while "
        "its webhook is bypassed (default 0: a client meets only well-formed jobs)",
    )
    p.add_argument("--history-window", type=int, default=10_000)
    p.add_argument("--bookmark-interval", type=float, default=60.0)
    p.add_argument(
        "--namespace", action="append", default=[], help="create this namespace at start (repeatable)"
    )
    p.add_argument(
        "--dcgm-port",
        type=int,
        default=None,
        help="serve a simulated NVIDIA dcgm-exporter (/metrics, /truth) for the GPUs of the cluster's pods "
        "on this port (0 picks a free one; default: not served)",
    )
    p.add_argument(
        "--dcgm-no-profiling",
        action="store_true",
        help="leave out dcgm-exporter's profiling fields (DCGM_FI_PROF_*), as on GPUs without DCGM profiling",
    )
    p.add_argument(
        "--dcgm-host-label",
        default="Hostname",
        choices=("Hostname", "hostname"),
        help="the host label's name: Hostname (dcgm-exporter 4.x, default) or hostname (its main branch)",
    )
    p.add_argument(
        "--no-pods",
        action="store_true",
        help="run no pods for the TrainJobs' JobSets (default: their pods are created, bound, run and fail)",
    )
    p.add_argument("--log-level", default="INFO")
    return p


async def serve(args: argparse.Namespace) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, stop.set)
    async with SimulatedCluster(
        args.host,
        args.port,
        history_window=args.history_window,
        bookmark_interval=args.bookmark_interval,
        token=args.token,
        auto_namespaces=False,  # a standalone cluster answers any client as a real one: 404 for those
        namespaces=tuple(args.namespace),
    ) as sim:
        generator = WorkloadGenerator(
            sim.store,
            seed=args.seed,
            max_jobs=max(args.jobs, 1),
            time_warp=args.time_warp,
            unregistered_ratio=args.unregistered_ratio,
            pods=not args.no_pods,
        )
        generator.load_runtimes()
        if args.jobs:
            generator.populate(args.jobs)
        if args.kubeconfig:
            sim.write_kubeconfig(args.kubeconfig)
        log.info(
            "simulated cluster at %s (resourceVersion %d%s)%s",
            sim.url,
            sim.store.resource_version,
            f", kubeconfig {args.kubeconfig}" if args.kubeconfig else "",
            "; Ctrl-C to stop",
        )
        async with contextlib.AsyncExitStack() as stack:
            if args.dcgm_port is not None:
                dcgm = SimulatedDcgmExporter(
                    sim.store,
                    args.host,
                    args.dcgm_port,
                    profiling=not args.dcgm_no_profiling,
                    host_label=args.dcgm_host_label,
                )
                await stack.enter_async_context(dcgm)
                log.info(
                    "simulated dcgm-exporter at %s/metrics (the expected values per TrainJob: /truth)",
                    dcgm.url,
                )
            runner = None
            if args.rate > 0:
                runner = asyncio.create_task(generator.run(args.rate, stop))
            await stop.wait()
            if runner is not None:
                await runner
            log.info("stopping simulated cluster")


def main(argv: list[str] | None = None) -> None:
    args = _parser().parse_args(argv)
    fmt = "%(asctime)s %(levelname)s %(name)s: %(message)s"
    logging.basicConfig(level=args.log_level.upper(), format=fmt)
    asyncio.run(serve(args))


if __name__ == "__main__":
    main()
