"""Command line: ``trainer-metrics [--simulate] [options]``. Flags override TRAINER_METRICS_* variables."""

from __future__ import annotations

import argparse
import asyncio
import functools
import logging
import os
import signal
import sys
from collections.abc import Callable, Sequence
from types import UnionType
from typing import TYPE_CHECKING, Annotated, Any, Literal, Union, get_args, get_origin

from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from app import __version__
from app.config import ENV_PREFIX, Settings, SettingsError, load_settings
from app.serving.logging_setup import configure_logging
from app.serving.tls import CertificateReloader, TLSConfigError, load_tls
from app.version import revision, version_line

if TYPE_CHECKING:
    from fastapi import FastAPI

    from app.serving.server import HttpServer

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
        f"leader election {election}"
        + (", simulated cluster" if settings.simulate else "")
        + f", revision {revision()}"
    )


def _probe_listener(settings: Settings) -> str:
    if not settings.probe_port:
        return "the main port"
    return f"{settings.host}:{settings.probe_port} (http)"


# The first setting of each group of `--help`, in the order of Settings' fields.
_SECTIONS: dict[str, str] = {
    "kubeconfig": "Kubernetes access",
    "leader_election": "leader election",
    "host": "HTTP server",
    "auth_enabled": "authentication and TLS",
    "log_level": "logging",
    "watch_timeout_min_seconds": "informers and limits",
    "zero_hold_seconds": "counting and hand-over",
    "per_trainjob_series": "per-TrainJob series",
    "pod_series": "pod series",
    "simulate": "simulated cluster",
}


class _VersionAction(argparse.Action):
    """--version: the version and the git revision (asked only when the flag is given)."""

    def __init__(self, option_strings: Sequence[str], dest: str, help: str | None = None) -> None:
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, help=help)

    def __call__(self, parser: argparse.ArgumentParser, *_: Any) -> None:
        print(version_line())
        parser.exit()


def _scalar_types(annotation: Any) -> list[Any]:
    """The types a setting's annotation allows, None and Annotated metadata left out."""
    if get_origin(annotation) is Annotated:
        annotation = get_args(annotation)[0]
    if get_origin(annotation) in (Union, UnionType):
        return [a for a in get_args(annotation) if a is not type(None)]
    return [annotation]


def _metavar(name: str, annotation: Any) -> str:
    if name == "probe_port":
        return "N|off"
    (kind,) = _scalar_types(annotation)
    if get_origin(kind) is Literal:
        return "{" + ",".join(str(a) for a in get_args(kind)) + "}"
    if get_origin(kind) is list:
        return "A,B,..."
    if kind is int:
        return "SECONDS" if name.endswith("_seconds") else "N"
    if kind is float:
        return "SECONDS" if name.endswith("_seconds") else "NUMBER"
    return "PATH" if name in ("kubeconfig", "tls_cert_file", "tls_key_file") else "TEXT"


def _default(field: FieldInfo) -> str | None:
    """The default as --help shows it; None when it is computed (the description says what it is) or
    means "unset"."""
    value = field.default
    if value is None or value is PydanticUndefined:
        return None
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, float):
        return _number(value)
    return str(value)


def _bounds(field: FieldInfo) -> str | None:
    """ "1 to 3600", "at least 0"... from the field's constraints (pydantic keeps them as metadata)."""
    low: float | None = None
    high: float | None = None
    for item in field.metadata:
        low = getattr(item, "ge", None) if getattr(item, "ge", None) is not None else low
        high = getattr(item, "le", None) if getattr(item, "le", None) is not None else high
    if low is None:
        return None if high is None else f"at most {_number(high)}"
    if high is None:
        return f"at least {_number(low)}"
    return f"{_number(low)} to {_number(high)}"


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else str(value)


def _setting_help(name: str, field: FieldInfo) -> str:
    text = (field.description or "").strip()
    tail = f"{ENV_PREFIX}{name.upper()}"
    bounds = _bounds(field)
    if bounds is not None:
        tail += f"; {bounds}"
    default = _default(field)
    if default is not None:
        tail += f"; default {default or '(empty)'}"
    return f"{text} [{tail}]".replace("%", "%%")


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="trainer-metrics",
        usage="%(prog)s [--simulate] [--SETTING VALUE ...] (--help lists them all)",
        description="Prometheus exporter for Kubeflow Trainer. Every setting is a flag and a "
        "TRAINER_METRICS_* environment variable (in brackets below); a flag wins over its variable. A bad "
        "value stops start-up with one line naming the setting (exit code 2).",
    )
    p.add_argument(
        "--version", action=_VersionAction, help="print the version and the git revision, and exit"
    )
    group: argparse._ArgumentGroup | argparse.ArgumentParser = p
    for name, field in Settings.model_fields.items():
        if name in _SECTIONS:
            group = p.add_argument_group(_SECTIONS[name])
        flag = "--" + name.replace("_", "-")
        help_text = _setting_help(name, field)
        if _scalar_types(field.annotation) == [bool]:
            group.add_argument(flag, action=argparse.BooleanOptionalAction, default=None, help=help_text)
        else:
            # A string for every value: the settings parse and check it, so a bad one gets the same one-line
            # message as from the environment.
            group.add_argument(flag, metavar=_metavar(name, field.annotation), default=None, help=help_text)
    # The simulated cluster's workload (kubesim.trainer.settings), used with --simulate only.
    for flag, metavar, text in (
        ("--sim-jobs", "N", "TrainJobs the generator keeps alive. [{}; 0 to 1000000; default 200]"),
        ("--sim-rate", "NUMBER", "generator steps per second. [{}; 0 to 10000; default 5]"),
        ("--sim-seed", "N", "the generator's random seed. [{}; default random]"),
    ):
        env = ENV_PREFIX + flag.removeprefix("--").replace("-", "_").upper()
        group.add_argument(flag, metavar=metavar, help="With --simulate, " + text.format(env))
    return p


def parse_flags(argv: Sequence[str] | None) -> tuple[dict[str, Any], dict[str, Any]]:
    """The flags given, as (Settings overrides, simulated-workload overrides); flags not given are left out,
    so their TRAINER_METRICS_* variables (or defaults) apply. Exits on --help, --version, unknown flags."""
    args = _parser().parse_args(argv)
    overrides: dict[str, Any] = {k: v for k, v in vars(args).items() if v is not None}
    # --sim-* flags configure the simulated cluster's workload (kubesim.trainer.settings), not the service.
    sim_overrides = {
        k.removeprefix("sim_"): overrides.pop(k) for k in list(overrides) if k.startswith("sim_")
    }
    return overrides, sim_overrides


def main(
    argv: Sequence[str] | None = None, *, before_serving: Callable[[FastAPI, HttpServer], None] | None = None
) -> int:
    """``before_serving``: called with the app and its bound server just before they serve (the tests' and
    the benchmarks' process runner adds its instrumentation there; the product passes nothing)."""
    overrides, sim_overrides = parse_flags(argv)
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
    if before_serving is not None:
        before_serving(app, server)
    try:
        asyncio.run(server.serve())
    except KeyboardInterrupt:
        pass  # uvicorn re-raises the Ctrl-C it handled once the stop is complete
    else:
        # asyncio's runner can swallow that re-raise when the main task ends at the same moment: the
        # server's own record of the signal decides.
        if server.exit_signal != signal.SIGINT:
            return 0
    # End as a Ctrl-C ends a process (killed by SIGINT, as the shell expects), without a traceback after
    # an orderly stop.
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    os.kill(os.getpid(), signal.SIGINT)
    return 0


if __name__ == "__main__":
    sys.exit(main())
