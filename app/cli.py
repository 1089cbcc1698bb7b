"""Command line: ``trainer-metrics [--simulate] [options]``. Flags override TRAINER_METRICS_* variables."""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Sequence
from typing import Any

import uvicorn

from app import __version__
from app.config import SettingsError, load_settings
from app.logging_setup import configure_logging
from app.tls import TLSConfigError, load_tls, uvicorn_tls_kwargs


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="trainer-metrics",
        description="Prometheus exporter for Kubeflow Trainer. Every flag has a TRAINER_METRICS_* "
        "environment variable; flags win.",
    )
    p.add_argument("--version", action="version", version=f"trainer-metrics {__version__}")
    p.add_argument(
        "--simulate",
        action="store_true",
        default=None,
        help="start the embedded simulated cluster with a workload generator and watch it",
    )
    p.add_argument("--host", help="bind address (default 0.0.0.0)")
    p.add_argument("--port", type=int, help="port (default 8080)")
    p.add_argument("--kubeconfig", help="kubeconfig path (default: in-cluster, $KUBECONFIG, ~/.kube/config)")
    p.add_argument("--kube-context", help="kubeconfig context")
    p.add_argument("--namespaces", help="comma-separated namespaces to watch (default: all)")
    p.add_argument(
        "--no-leader-election",
        dest="leader_election",
        action="store_false",
        default=None,
        help="export from this replica without electing a leader (single replica only)",
    )
    p.add_argument("--identity", help="identity in the Lease (default $POD_NAME)")
    p.add_argument("--lease-name", help="Lease name")
    p.add_argument("--lease-namespace", help="Lease namespace")
    p.add_argument("--log-level", choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    p.add_argument("--log-format", choices=["text", "json"])
    p.add_argument("--sim-jobs", type=int, help="simulate: TrainJobs the generator keeps alive")
    p.add_argument("--sim-rate", type=float, help="simulate: generator steps per second")
    p.add_argument("--sim-seed", type=int, help="simulate: random seed")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    overrides: dict[str, Any] = {k: v for k, v in vars(args).items() if v is not None}
    try:
        settings = load_settings(**overrides)
    except SettingsError as exc:
        print(f"trainer-metrics: {exc}", file=sys.stderr)
        return 2
    configure_logging(settings.log_level, settings.log_format)
    try:
        tls = load_tls(settings)
    except TLSConfigError as exc:
        print(f"trainer-metrics: {exc}", file=sys.stderr)
        return 2

    from app.main import create_app

    cluster = None
    if settings.simulate:
        from app.simulate import embedded_cluster

        cluster = embedded_cluster
    app = create_app(settings, cluster=cluster, tls=tls)
    uvicorn.run(
        app,
        host=settings.host,
        port=settings.port,
        log_config=None,
        access_log=False,
        timeout_graceful_shutdown=math.ceil(settings.renew_deadline_seconds),
        **uvicorn_tls_kwargs(tls),
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
