"""Fault injection for the simulated cluster, driven from tests (``sim.faults``).

Each fault targets requests by resource plural, HTTP method, path prefix and/or watch-ness. The server asks
``check_auth`` and ``check_authorization`` (RBAC denials: ``deny``) then ``before_request`` at the start of
every request and ``watch_stall`` before every watch write; everything that acts on open streams goes
through the server's ``WatchControl``.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from dataclasses import dataclass, field
from typing import Protocol

import orjson

from kubesim.apiserver.resources import ResourceKind
from kubesim.apiserver.status import status_body
from kubesim.apiserver.storage.store import Store

# The apiserver's max-inflight / APF rejection: net/http's http.Error, so text/plain and a trailing newline.
TOO_MANY_REQUESTS_BODY = b"Too many requests, please try again later.\n"

_STATUS_FAULTS = {
    500: ("InternalError", "Internal error occurred: injected fault"),
    503: ("ServiceUnavailable", "the server is currently unable to handle the request"),
    504: (
        "Timeout",
        "the server was unable to return a response in the time allotted, "
        "but may still be processing the request",
    ),
}


@dataclass(frozen=True, slots=True)
class RequestInfo:
    method: str
    path: str
    resource: ResourceKind | None
    namespace: str | None
    name: str | None
    subresource: str | None
    watch: bool


@dataclass(frozen=True, slots=True)
class Target:
    """Which requests a fault applies to; None matches anything."""

    resource: str | None = None  # plural, e.g. "trainjobs" or "leases"
    method: str | None = None
    path: str | None = None  # path prefix
    watch: bool | None = None

    def matches(self, info: RequestInfo) -> bool:
        if self.resource is not None and (info.resource is None or info.resource.plural != self.resource):
            return False
        if self.method is not None and info.method.upper() != self.method.upper():
            return False
        if self.path is not None and not info.path.startswith(self.path):
            return False
        return self.watch is None or self.watch == info.watch


@dataclass(frozen=True, slots=True)
class FaultResponse:
    status: int
    body: bytes
    content_type: str
    headers: dict[str, str] = field(default_factory=dict)


@dataclass(slots=True)
class _Failure:
    target: Target
    remaining: int
    response: FaultResponse


@dataclass(slots=True)
class _Stall:
    target: Target
    released: asyncio.Event
    send_headers: bool = True


@dataclass(slots=True)
class _ResetRule:
    target: Target
    remaining: int
    after_events: int


class WatchControl(Protocol):
    """What the server exposes so faults can act on open watch streams."""

    def close_watches(self, *, abrupt: bool = False) -> int: ...
    def reset_watches(self, target: Target) -> int: ...
    def wake_watches(self) -> None: ...


def status_response(code: int, reason: str, message: str, retry_after: int | None = None) -> FaultResponse:
    details = {"retryAfterSeconds": retry_after} if retry_after is not None else None
    headers = {"Retry-After": str(retry_after)} if retry_after is not None else {}
    body = orjson.dumps(status_body(code, reason, message, details))
    return FaultResponse(code, body, "application/json", headers)


# The user the authorizer names in a denial: the exporter's service account, as the chart installs it.
DENIED_USER = "system:serviceaccount:default:trainer-metrics"


@dataclass(frozen=True, slots=True)
class _Denial:
    resource: str  # plural
    namespace: str | None  # None: every namespace and the cluster scope
    verbs: frozenset[str] | None  # None: every verb


def request_verb(info: RequestInfo) -> str:
    """The authorization verb of a resource request (k8s.io/apiserver pkg/endpoints/request
    requestinfo.go)."""
    method = info.method.upper()
    if method in ("GET", "HEAD"):
        if info.watch:
            return "watch"
        return "get" if info.name is not None else "list"
    if method == "DELETE":
        return "delete" if info.name is not None else "deletecollection"
    return {"POST": "create", "PUT": "update", "PATCH": "patch"}.get(method, method.lower())


def forbidden_response(info: RequestInfo, user: str = DENIED_USER) -> FaultResponse:
    """The RBAC authorizer's 403 (k8s.io/apiserver pkg/endpoints/handlers/responsewriters errors.go
    forbiddenMessage), e.g. ``pods is forbidden: User "..." cannot list resource "pods" in API group "" at
    the cluster scope``."""
    assert info.resource is not None
    verb, plural, group = request_verb(info), info.resource.plural, info.resource.group
    what = f"{plural}/{info.subresource}" if info.subresource else plural
    named = f' "{info.name}"' if info.name is not None else ""
    scope = f'in the namespace "{info.namespace}"' if info.namespace else "at the cluster scope"
    message = (
        f'{plural}{named} is forbidden: User "{user}" cannot {verb} resource "{what}" '
        f'in API group "{group}" {scope}'
    )
    details: dict[str, str] = {"group": group, "kind": plural} if group else {"kind": plural}
    if info.name is not None:
        details = {"name": info.name, **details}
    body = orjson.dumps(status_body(403, "Forbidden", message, details))
    return FaultResponse(403, body, "application/json", {})


class Faults:
    def __init__(self, store: Store) -> None:
        self.store = store
        self.counters: Counter[str] = Counter()
        self._control: WatchControl | None = None
        self._failures: list[_Failure] = []
        self._request_stalls: list[_Stall] = []
        self._watch_stalls: list[_Stall] = []
        self._reset_rules: list[_ResetRule] = []
        self._denials: list[_Denial] = []
        self._token: str | None = None

    def attach(self, control: WatchControl) -> None:
        self._control = control

    # -- failing requests -------------------------------------------------------------------
    def fail_next(
        self,
        n: int = 1,
        *,
        status: int = 429,
        retry_after: int | None = 1,
        resource: str | None = None,
        method: str | None = None,
        path: str | None = None,
        watch: bool | None = None,
    ) -> None:
        """The next ``n`` matching requests fail: 429 text/plain (like max-inflight), 500/503/504 Status."""
        if status == 429:
            headers = {"Retry-After": str(retry_after)} if retry_after is not None else {}
            headers["X-Content-Type-Options"] = "nosniff"
            response = FaultResponse(429, TOO_MANY_REQUESTS_BODY, "text/plain; charset=utf-8", headers)
        elif status in _STATUS_FAULTS:
            reason, message = _STATUS_FAULTS[status]
            response = status_response(status, reason, message, retry_after if status != 500 else None)
        else:
            raise ValueError(f"unsupported fault status {status}")
        self._failures.append(_Failure(Target(resource, method, path, watch), n, response))

    # -- stalls -----------------------------------------------------------------------------
    def stall_requests(
        self,
        *,
        resource: str | None = None,
        method: str | None = None,
        path: str | None = None,
        watch: bool | None = None,
    ) -> None:
        """Matching requests hang (no response at all) until ``release_requests``: the hung API call."""
        self._request_stalls.append(_Stall(Target(resource, method, path, watch), asyncio.Event()))

    def release_requests(self) -> None:
        for stall in self._request_stalls:
            stall.released.set()
        self._request_stalls.clear()

    def stall_watches(self, *, resource: str | None = None, send_headers: bool = True) -> None:
        """Open and new matching watch streams go silent (socket open, nothing sent, no bookmarks, no
        deadline) until ``release_watches``. New streams still get their headers unless send_headers=False."""
        self._watch_stalls.append(_Stall(Target(resource, watch=True), asyncio.Event(), send_headers))
        self.counters["watch_stalls"] += 1

    def release_watches(self) -> None:
        for stall in self._watch_stalls:
            stall.released.set()
        self._watch_stalls.clear()
        if self._control is not None:
            self._control.wake_watches()

    def watch_stall(self, info: RequestInfo) -> asyncio.Event | None:
        """The release event if this watch stream must stay silent now."""
        for stall in self._watch_stalls:
            if stall.target.matches(info):
                return stall.released
        return None

    def watch_stall_sends_headers(self, info: RequestInfo) -> bool:
        return all(s.send_headers for s in self._watch_stalls if s.target.matches(info))

    # -- resets -----------------------------------------------------------------------------
    def reset_watches(self, *, resource: str | None = None) -> int:
        """Open matching watch streams write half an event, then get aborted; returns how many."""
        if self._control is None:
            return 0
        # Counted in watch_resets when the stream is actually cut.
        return self._control.reset_watches(Target(resource, watch=True))

    def reset_next_watches(self, n: int = 1, *, resource: str | None = None, after_events: int = 0) -> None:
        """The next ``n`` matching watch streams are cut mid-event after ``after_events`` events."""
        self._reset_rules.append(_ResetRule(Target(resource, watch=True), n, after_events))

    def take_reset_rule(self, info: RequestInfo) -> int | None:
        """For a new watch: events to deliver before a mid-event reset, or None."""
        for rule in self._reset_rules:
            if rule.remaining > 0 and rule.target.matches(info):
                rule.remaining -= 1
                if rule.remaining == 0:
                    self._reset_rules.remove(rule)
                return rule.after_events
        return None

    def count_reset(self) -> None:
        self.counters["watch_resets"] += 1

    # -- whole-cluster faults ---------------------------------------------------------------
    def compact(self) -> None:
        """etcd compaction at the current revision: older watch resumes and continue tokens get 410."""
        self.store.compact()
        self.counters["compactions"] += 1

    def restart(self, *, abrupt: bool = False) -> int:
        """apiserver restart: every watch stream ends (cleanly, or by connection reset if ``abrupt``) and
        the new watch cache starts at the current revision (a watch from an older one gets 410); objects
        stay, and so do etcd's revisions (Exact lists, continue tokens). Returns the streams dropped."""
        dropped = self._control.close_watches(abrupt=abrupt) if self._control is not None else 0
        self.store.restart_watch_cache()
        self.counters["restarts"] += 1
        return dropped

    # -- authentication ---------------------------------------------------------------------
    @property
    def token(self) -> str | None:
        return self._token

    def set_token(self, token: str | None) -> None:
        """Require ``Authorization: Bearer <token>`` (None: no authentication). Changing it makes clients
        that still send the old token get 401, like a rotated service-account token."""
        self._token = token

    # -- authorization ----------------------------------------------------------------------
    def deny(
        self, resource: str, *, namespace: str | None = None, verbs: tuple[str, ...] | None = None
    ) -> None:
        """RBAC without a grant: requests for ``resource`` (plural), in ``namespace`` (None: everywhere),
        with one of ``verbs`` (None: any) get the authorizer's 403 until ``allow`` (or ``clear``)."""
        self._denials.append(_Denial(resource, namespace, frozenset(verbs) if verbs is not None else None))

    def allow(self, resource: str) -> None:
        """Lift every denial of ``resource``: a Role granted later."""
        self._denials = [d for d in self._denials if d.resource != resource]

    def check_authorization(self, info: RequestInfo) -> FaultResponse | None:
        if not self._denials or info.resource is None:
            return None
        verb = request_verb(info)
        for denial in self._denials:
            if (
                denial.resource == info.resource.plural
                and (denial.namespace is None or denial.namespace == info.namespace)
                and (denial.verbs is None or verb in denial.verbs)
            ):
                self.counters["forbidden"] += 1
                return forbidden_response(info)
        return None

    # -- hooks for the server ---------------------------------------------------------------
    def check_auth(self, authorization: str | None) -> FaultResponse | None:
        if self._token is None or authorization == f"Bearer {self._token}":
            return None
        self.counters["unauthorized"] += 1
        return FaultResponse(
            401, orjson.dumps(status_body(401, "Unauthorized", "Unauthorized")), "application/json"
        )

    async def before_request(self, info: RequestInfo) -> FaultResponse | None:
        """Apply request faults: hang while a matching stall is active, then maybe fail."""
        for stall in list(self._request_stalls):
            if stall.target.matches(info) and not stall.released.is_set():
                self.counters["stalled_requests"] += 1
                await stall.released.wait()
        for failure in self._failures:
            if failure.remaining > 0 and failure.target.matches(info):
                failure.remaining -= 1
                if failure.remaining == 0:
                    self._failures.remove(failure)
                self.counters[f"status_{failure.response.status}"] += 1
                return failure.response
        return None

    def clear(self) -> None:
        """Remove every pending fault and release everything stalled (the token stays)."""
        self._failures.clear()
        self._reset_rules.clear()
        self._denials.clear()
        self.release_requests()
        self.release_watches()
