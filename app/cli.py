"""Command line: ``trainer-metrics [--simulate] [options]``. Flags override TRAINER_METRICS_* variables."""

from __future__ import annotations

import argparse
import asyncio
import functools
import logging
import sys
from collections.abc import Sequence
from typing import Any

from app import __version__
from app.config import Settings, SettingsError, load_settings
from app.serving.logging_setup import configure_logging
from app.serving.tls import CertificateReloader, TLSConfigError, load_tls

log = logging.getLogger(__name__)


def startup_line(settings: Settings, tls: CertificateReloader | None) -> str:
    """What an operator checks first in a pod's log: the version, what it watches, and how it is guarded."""
    namespaces = ",".join(settings.namespaces) if settings.namespaces else "all"
    election = (
        f"on (Lease {settings.lease_namespace}/{settings.lease_name}, identity {settings.identity})"
        if settings.leader_election
        else "off"
    )
    return (
        f"trainer-metrics {__version__} starting: "
        f"listening on {settings.host}:{settings.port} ({'https' if tls else 'http'}), "
        f"probes on {_probe_listener(settings)}, "
        f"namespaces {namespaces}, "
        f"auth {'on (TokenReview + SubjectAccessReview)' if settings.auth_enabled else 'off'}, "
        f"TLS {'on (' + str(settings.tls_cert_file) + ')' if tls else 'off'}, "
        f"debug endpoints {'on' if settings.debug_endpoints else 'off'}, "
        f"leader election {election}" + (", simulated cluster" if settings.simulate else "")
    )


def _probe_listener(settings: Settings) -> str:
    if not settings.probe_port:
        return "the main port"
    return f"{settings.host}:{settings.probe_port} (http)"


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
    p.add_argument("--probe-port", help="port of the probe-only listener (default 8081; 0: any; off: none)")
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
    # --sim-* flags configure the simulated cluster's workload (kubesim.trainer.settings), not the service.
    sim_overrides = {
        k.removeprefix("sim_"): overrides.pop(k) for k in list(overrides) if k.startswith("sim_")
    }
    try:
        settings = load_settings(**overrides)
    except SettingsError as exc:
        print(f"trainer-metrics: {exc}", file=sys.stderr)
        return 2
    sim_settings = None
    if settings.simulate:
        from app.replica.simulate import SimulateError, load_simulation

        try:
            sim_settings = load_simulation(**sim_overrides)
        except SimulateError as exc:
            print(f"trainer-metrics: {exc}", file=sys.stderr)
            return 2
    configure_logging(settings.log_level, settings.log_format)
    try:
        tls = load_tls(settings)
    except TLSConfigError as exc:
        print(f"trainer-metrics: {exc}", file=sys.stderr)
        return 2
    if not settings.simulate:  # the embedded cluster writes its own kubeconfig
        from app.replica.preflight import check_kube_access

        try:
            # Before anything is logged or bound: a bad kubeconfig is the one line printed, exit code 2.
            asyncio.run(check_kube_access(settings))
        except SettingsError as exc:
            print(f"trainer-metrics: {exc}", file=sys.stderr)
            return 2
    log.info(startup_line(settings, tls))

    from app.main import create_app
    from app.replica.extra_telemetry import register_collector
    from app.serving.limits import ServerStartError
    from app.serving.server import HttpServer

    cluster = None
    if settings.simulate:
        from app.replica.simulate import embedded_cluster

        cluster = functools.partial(embedded_cluster, sim_settings=sim_settings)
    app = create_app(settings, cluster=cluster, tls=tls, owns_process=True)
    try:
        server = HttpServer(app, settings, tls)  # binds both listeners now: a port in use fails here
    except ServerStartError as exc:
        print(f"trainer-metrics: {exc}", file=sys.stderr)
        return 2
    register_collector(app, server.telemetry)
    asyncio.run(server.serve())
    return 0


if __name__ == "__main__":
    sys.exit(main())
