"""Check Kubernetes access before anything starts: a bad kubeconfig is one line naming the setting.

Without this, a missing file, a directory, garbage, an unknown context or a credential that cannot be
loaded surfaces inside the server's lifespan as a 35-line traceback and exit code 3 (and a missing file
reads "Expected key current-context"). Here the same loading the service does (``KubeClient.connect``:
no request is sent) runs first, after checks that give each common mistake its own message.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

import yaml
from kubernetes_asyncio.config.incluster_config import SERVICE_HOST_ENV_NAME

from app.config import ENV_PREFIX, Settings, SettingsError
from app.kube.client import KubeClient

_MAX_KUBECONFIG_BYTES = 16 * 1024 * 1024  # real ones are kilobytes; embedded certificates add a few more
_MAX_DETAIL_CHARS = 300


def _setting(name: str) -> str:
    return f"invalid setting {name} ({ENV_PREFIX}{name.upper()})"


def _one_line(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.strerror:
        text = f"{exc.filename}: {exc.strerror}" if exc.filename else exc.strerror
    else:
        text = str(exc) or type(exc).__name__
    text = " ".join(text.split())
    return text if len(text) <= _MAX_DETAIL_CHARS else text[:_MAX_DETAIL_CHARS] + "..."


def _source(settings: Settings) -> tuple[str, list[Path]] | None:
    """Which setting names the kubeconfig, and its file(s); None for the in-cluster service account."""
    if settings.kubeconfig:
        return _setting("kubeconfig"), [Path(settings.kubeconfig).expanduser()]
    if os.environ.get(SERVICE_HOST_ENV_NAME):
        return None
    where = f"{_setting('kubeconfig')}: unset, so"
    env = os.environ.get("KUBECONFIG")
    if env:
        paths = [Path(p).expanduser() for p in env.split(os.pathsep) if p]
        return f"{where} $KUBECONFIG", paths
    return f"{where} ~/.kube/config", [Path("~/.kube/config").expanduser()]


def _read(name: str, path: Path) -> dict[str, Any]:
    """The parsed file, or SettingsError saying what is wrong with it."""
    if not path.exists():
        raise SettingsError(f"{name}: {path} does not exist")
    if not path.is_file():
        raise SettingsError(f"{name}: {path} is not a file")
    try:
        with path.open("rb") as f:
            data = f.read(_MAX_KUBECONFIG_BYTES + 1)
    except OSError as exc:
        raise SettingsError(f"{name}: cannot read {path}: {exc.strerror or exc}") from None
    if len(data) > _MAX_KUBECONFIG_BYTES:
        raise SettingsError(f"{name}: {path} is larger than {_MAX_KUBECONFIG_BYTES} bytes")
    try:
        parsed = yaml.safe_load(data)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        at = f" at line {mark.line + 1}" if mark is not None else ""
        raise SettingsError(f"{name}: {path} is not valid YAML{at}") from None
    if not isinstance(parsed, dict) or not any(k in parsed for k in ("clusters", "contexts", "users")):
        raise SettingsError(f"{name}: {path} is not a kubeconfig (no clusters, contexts or users)")
    return parsed


def _named(items: Any, name: str) -> dict[str, Any] | None:
    """The entry called ``name`` in a kubeconfig list (contexts, clusters, users)."""
    for item in items if isinstance(items, list) else []:
        if isinstance(item, dict) and item.get("name") == name:
            body = item.get("context") or item.get("cluster") or item.get("user") or {}
            return body if isinstance(body, dict) else {}
    return None


def _check_context(name: str, path: Path, config: dict[str, Any], context: str | None) -> str:
    """The context that will be used, after checking it exists and names a cluster and a user."""
    if context is None:
        current = config.get("current-context")
        if not current:
            raise SettingsError(
                f"{_setting('kube_context')}: unset, and {path} has no current-context; set one of its "
                f"contexts ({_context_names(config)})"
            )
        context, name = str(current), f"{name}: current-context of {path}"
    else:
        name = _setting("kube_context")
    body = _named(config.get("contexts"), context)
    if body is None:
        raise SettingsError(
            f"{name}: context {context!r} is not in {path} (contexts: {_context_names(config)})"
        )
    for kind, plural in (("cluster", "clusters"), ("user", "users")):
        ref = body.get(kind)
        if ref and _named(config.get(plural), str(ref)) is None:
            raise SettingsError(f"{name}: context {context!r} names {kind} {ref!r}, which is not in {path}")
    return context


def _context_names(config: dict[str, Any]) -> str:
    contexts = config.get("contexts")
    if not isinstance(contexts, list):
        return "none"
    names = [str(c.get("name")) for c in contexts if isinstance(c, dict)]
    return ", ".join(names[:10]) + (", ..." if len(names) > 10 else "") if names else "none"


async def check_kube_access(settings: Settings) -> None:
    """Load the Kubernetes configuration and credentials as the service will; SettingsError if unusable."""
    source = _source(settings)
    context = settings.kube_context
    if source is None:
        name = "the in-cluster service account"
    else:
        name, paths = source
        existing = [p for p in paths if p.exists()]
        if not existing:
            raise SettingsError(f"{name}: {', '.join(str(p) for p in paths)} does not exist")
        if len(paths) == 1:
            # One file: check it in detail. A $KUBECONFIG list is merged by the loader; it reports.
            config = _read(name, paths[0])
            context = _check_context(name, paths[0], config, context)
    # kubernetes-asyncio logs some failures (an exec plugin that cannot run) before raising them: the one
    # line below says it, so keep its logger quiet meanwhile.
    loader_log = logging.getLogger("kubernetes_asyncio")
    level, loader_log.level = loader_log.level, logging.CRITICAL
    try:
        client = await KubeClient.connect(settings.kubeconfig, settings.kube_context)
    except Exception as exc:  # the loader raises anything from ConfigException to TypeError
        what = f"context {context!r}: " if context else ""
        hint = f"; set kubeconfig ({ENV_PREFIX}KUBECONFIG) to use a kubeconfig" if source is None else ""
        raise SettingsError(f"{name}: cannot load {what}{_one_line(exc)}{hint}") from None
    finally:
        loader_log.setLevel(level)
    await client.close()
