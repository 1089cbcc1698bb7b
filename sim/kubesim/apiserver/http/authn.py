"""TokenReview and SubjectAccessReview for the simulated cluster (what delegated auth needs of the API).

``TokenRegistry`` plays the apiserver's token authenticator (bearer token → user) and an RBAC authorizer
restricted to non-resource URLs (ClusterRole ``nonResourceURLs`` bound to users, groups, service accounts),
with Kubernetes' matching: a rule URL ``*`` matches every path, ``/debug/*`` every path that starts with
``/debug/``, anything else only itself. Response bodies are shaped as the real API writes them, status 201.

    registry = TokenRegistry()
    registry.add_service_account("prom-token", "monitoring", "prometheus")
    registry.allow(paths=["/metrics"], service_accounts=["monitoring/prometheus"])
    install_auth_routes(sim.server, registry)     # a SimServer (before it serves), or a web.Application
"""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import orjson
from aiohttp import web

from kubesim.apiserver.status import FieldError, StoreError, bad_request, invalid, status_body

TOKEN_REVIEW_PATH = "/apis/authentication.k8s.io/v1/tokenreviews"
SUBJECT_ACCESS_REVIEW_PATH = "/apis/authorization.k8s.io/v1/subjectaccessreviews"
DEFAULT_API_AUDIENCES = ("https://kubernetes.default.svc.cluster.local",)
AUTHENTICATED_GROUP = "system:authenticated"
MASTERS_GROUP = "system:masters"

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@dataclass(frozen=True, slots=True)
class UserInfo:
    username: str
    uid: str = ""
    groups: tuple[str, ...] = ()
    extra: Mapping[str, tuple[str, ...]] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        # authenticationv1.UserInfo: every field is omitempty.
        out: dict[str, Any] = {}
        if self.username:
            out["username"] = self.username
        if self.uid:
            out["uid"] = self.uid
        if self.groups:
            out["groups"] = list(self.groups)
        if self.extra:
            out["extra"] = {k: list(v) for k, v in self.extra.items()}
        return out


@dataclass(slots=True)
class _Token:
    user: UserInfo
    audiences: tuple[str, ...]
    error: str | None = None  # set: the token is known but no longer valid (expired, revoked)


@dataclass(frozen=True, slots=True)
class AccessRule:
    """A ClusterRole with non-resource rules and the ClusterRoleBinding that grants it, in one."""

    name: str
    paths: tuple[str, ...]
    verbs: tuple[str, ...] = ("get",)
    users: tuple[str, ...] = ()
    groups: tuple[str, ...] = ()
    service_accounts: tuple[str, ...] = ()  # "namespace/name"
    deny: bool = False  # an explicit denial (as a webhook authorizer can give; RBAC never denies)

    def matches_request(self, verb: str, path: str) -> bool:
        verb_ok = "*" in self.verbs or verb in self.verbs
        return verb_ok and any(non_resource_url_matches(rule, path) for rule in self.paths)

    def subject_for(self, user: str, groups: Sequence[str]) -> str | None:
        """The subject of the binding that applies to this user, described as RBAC does; None if none."""
        if user in self.users:
            return f'User "{user}"'
        for sa in self.service_accounts:
            namespace, _, name = sa.partition("/")
            if user == f"system:serviceaccount:{namespace}:{name}":
                return f'ServiceAccount "{name}/{namespace}"'
        for group in self.groups:
            if group in groups:
                return f'Group "{group}"'
        return None


def non_resource_url_matches(rule_url: str, path: str) -> bool:
    """rbac/v1 NonResourceURLMatches: exact, ``*`` for all, or a trailing ``*`` as a prefix match."""
    if rule_url in ("*", path):
        return True
    return rule_url.endswith("*") and path.startswith(rule_url.rstrip("*"))


class TokenRegistry:
    """Known bearer tokens, the users they name, and who may ``get`` which non-resource URLs."""

    def __init__(self, api_audiences: Sequence[str] = DEFAULT_API_AUDIENCES) -> None:
        self.api_audiences = tuple(api_audiences)
        self.rules: list[AccessRule] = []
        # Set to make the reviews themselves fail with 403, as when the caller lacks system:auth-delegator.
        self.reviewer_forbidden = False
        self.counters: dict[str, int] = {"tokenreviews": 0, "subjectaccessreviews": 0}
        self._tokens: dict[str, _Token] = {}

    # -- tokens ------------------------------------------------------------------------------------
    def add_user(
        self,
        token: str,
        username: str,
        *,
        uid: str | None = None,
        groups: Iterable[str] = (),
        extra: Mapping[str, Sequence[str]] | None = None,
        audiences: Sequence[str] | None = None,
    ) -> UserInfo:
        """Register a token for a user; like the apiserver, every authenticated user is also in
        ``system:authenticated``."""
        all_groups = list(groups)
        if AUTHENTICATED_GROUP not in all_groups:
            all_groups.append(AUTHENTICATED_GROUP)
        user = UserInfo(
            username,
            uid if uid is not None else str(uuid.uuid4()),
            tuple(all_groups),
            {k: tuple(v) for k, v in (extra or {}).items()},
        )
        self._tokens[token] = _Token(user, tuple(audiences) if audiences is not None else self.api_audiences)
        return user

    def add_service_account(
        self, token: str, namespace: str, name: str, *, audiences: Sequence[str] | None = None
    ) -> UserInfo:
        """A service-account token: user and groups as the apiserver derives them, pod-bound extra."""
        return self.add_user(
            token,
            f"system:serviceaccount:{namespace}:{name}",
            groups=("system:serviceaccounts", f"system:serviceaccounts:{namespace}"),
            extra={"authentication.kubernetes.io/credential-id": [f"JTI={uuid.uuid4()}"]},
            audiences=audiences,
        )

    def invalidate(self, token: str, error: str = "token has expired") -> None:
        """The token keeps being presented but no longer authenticates (expired, revoked)."""
        entry = self._tokens.get(token)
        if entry is not None:
            entry.error = error

    def remove(self, token: str) -> None:
        self._tokens.pop(token, None)

    # -- rules -------------------------------------------------------------------------------------
    def allow(
        self,
        *,
        paths: Iterable[str],
        verbs: Iterable[str] = ("get",),
        users: Iterable[str] = (),
        groups: Iterable[str] = (),
        service_accounts: Iterable[str] = (),
        name: str | None = None,
        deny: bool = False,
    ) -> AccessRule:
        rule = AccessRule(
            name=name or f"rule-{len(self.rules)}",
            paths=tuple(paths),
            verbs=tuple(verbs),
            users=tuple(users),
            groups=tuple(groups),
            service_accounts=tuple(service_accounts),
            deny=deny,
        )
        self.rules.append(rule)
        return rule

    def deny(self, **kwargs: Any) -> AccessRule:
        return self.allow(deny=True, **kwargs)

    def revoke(self, rule: AccessRule) -> None:
        self.rules.remove(rule)

    # -- decisions ---------------------------------------------------------------------------------
    def authenticate(self, token: str, audiences: Sequence[str]) -> dict[str, Any]:
        """TokenReview status. Unknown tokens: ``{"user": {}}`` (authenticated is omitempty, so absent)."""
        entry = self._tokens.get(token)
        if entry is None:
            return {"user": {}}
        if entry.error is not None:
            return {"user": {}, "error": entry.error}
        wanted = tuple(audiences) or self.api_audiences
        granted = [a for a in wanted if a in entry.audiences]
        if not granted:
            return {"user": {}, "error": "token audiences is invalid for the target audiences"}
        return {"authenticated": True, "user": entry.user.to_json(), "audiences": granted}

    def authorize(self, user: str, groups: Sequence[str], verb: str, path: str) -> dict[str, Any]:
        """SubjectAccessReview status for a non-resource request."""
        if MASTERS_GROUP in groups:
            return {"allowed": True}  # the privileged-group authorizer runs before RBAC
        for rule in self.rules:  # explicit denials win, whatever the order
            if rule.deny and rule.matches_request(verb, path) and rule.subject_for(user, groups):
                return {"allowed": False, "denied": True, "reason": f"denied by rule {rule.name!r}"}
        for rule in self.rules:
            if rule.deny or not rule.matches_request(verb, path):
                continue
            subject = rule.subject_for(user, groups)
            if subject is not None:
                reason = (
                    f'RBAC: allowed by ClusterRoleBinding "{rule.name}" of ClusterRole "{rule.name}" '
                    f"to {subject}"
                )
                return {"allowed": True, "reason": reason}
        return {"allowed": False}  # RBAC has no opinion: not allowed, not denied, no reason


# ---------------------------------------------------------------------------------------------- HTTP


def _json(obj: Any, status: int = 201) -> web.Response:
    return web.Response(body=orjson.dumps(obj), status=status, content_type="application/json")


def _error(err: StoreError) -> web.Response:
    return web.Response(
        body=orjson.dumps(err.status), status=err.code, content_type="application/json", headers=err.headers
    )


async def _read_review(request: web.Request, kind: str, api_version: str) -> dict[str, Any]:
    try:
        body = orjson.loads(await request.read())
    except orjson.JSONDecodeError as exc:
        raise bad_request(f"couldn't get version/kind; json parse error: {exc}") from None
    if not isinstance(body, dict):
        raise bad_request("couldn't get version/kind; json parse error: expected an object")
    if body.get("kind", kind) != kind or body.get("apiVersion", api_version) != api_version:
        raise bad_request(
            f"the API version in the data ({body.get('apiVersion')}) does not match the expected API version "
            f"({api_version})"
        )
    spec = body.get("spec")
    if not isinstance(spec, dict):
        spec = {}
    return spec


def _forbidden_reviewer(resource: str, group: str) -> StoreError:
    message = (
        f'{resource}.{group} is forbidden: User "system:serviceaccount:default:trainer-metrics" '
        f'cannot create resource "{resource}" in API group "{group}" at the cluster scope'
    )
    return StoreError(403, status_body(403, "Forbidden", message, {"group": group, "kind": resource}))


def token_review_handler(registry: TokenRegistry) -> Handler:
    async def handle(request: web.Request) -> web.StreamResponse:
        try:
            if registry.reviewer_forbidden:
                raise _forbidden_reviewer("tokenreviews", "authentication.k8s.io")
            spec = await _read_review(request, "TokenReview", "authentication.k8s.io/v1")
            token = spec.get("token")
            if not isinstance(token, str) or not token:
                raise bad_request("token is required for TokenReview in authentication")
            audiences = spec.get("audiences") or []
            if not isinstance(audiences, list):
                raise bad_request("spec.audiences: expected a list of strings")
            registry.counters["tokenreviews"] += 1
            status = registry.authenticate(token, [str(a) for a in audiences])
        except StoreError as err:
            return _error(err)
        return _json(
            {
                "kind": "TokenReview",
                "apiVersion": "authentication.k8s.io/v1",
                "metadata": {"creationTimestamp": None},
                "spec": spec,
                "status": status,
            }
        )

    return handle


def subject_access_review_handler(registry: TokenRegistry) -> Handler:
    async def handle(request: web.Request) -> web.StreamResponse:
        try:
            if registry.reviewer_forbidden:
                raise _forbidden_reviewer("subjectaccessreviews", "authorization.k8s.io")
            spec = await _read_review(request, "SubjectAccessReview", "authorization.k8s.io/v1")
            errors: list[FieldError] = []
            has_resource = spec.get("resourceAttributes") is not None
            non_resource = spec.get("nonResourceAttributes")
            if has_resource == (non_resource is not None):
                errors.append(
                    FieldError(
                        "spec.resourceAttributes",
                        "Invalid",
                        "exactly one of nonResourceAttributes or resourceAttributes must be specified",
                        "nil" if not has_resource else "&authorization.ResourceAttributes{...}",
                    )
                )
            user = str(spec.get("user") or "")
            groups = [str(g) for g in spec.get("groups") or []]
            if not user and not groups:
                errors.append(
                    FieldError(
                        "spec.user", "Invalid", "at least one of user or group must be specified", '""'
                    )
                )
            if errors:
                raise invalid("SubjectAccessReview", "authorization.k8s.io", "", errors)
            registry.counters["subjectaccessreviews"] += 1
            if isinstance(non_resource, dict):
                status = registry.authorize(
                    user, groups, str(non_resource.get("verb") or ""), str(non_resource.get("path") or "")
                )
            else:
                # Resource requests are outside this simulation: only the privileged group gets them.
                status = {"allowed": True} if MASTERS_GROUP in groups else {"allowed": False}
        except StoreError as err:
            return _error(err)
        return _json(
            {
                "kind": "SubjectAccessReview",
                "apiVersion": "authorization.k8s.io/v1",
                "metadata": {"creationTimestamp": None},
                "spec": spec,
                "status": status,
            }
        )

    return handle


class RouteHost(Protocol):
    """What ``SimServer`` offers: exact-path routes dispatched after its own auth and fault checks."""

    def add_route(self, method: str, path: str, handler: Handler) -> None: ...


def install_auth_routes(app: web.Application | RouteHost, registry: TokenRegistry) -> None:
    """Serve POST tokenreviews and subjectaccessreviews from ``registry``.

    Given a ``SimServer`` (``SimulatedCluster.server``), the routes go through its dispatcher, so the
    cluster's own token check and fault injection apply to them like to any API call. Given a plain
    ``web.Application``, they are added to its router (do it before the app starts).
    """
    routes = (
        (TOKEN_REVIEW_PATH, token_review_handler(registry)),
        (SUBJECT_ACCESS_REVIEW_PATH, subject_access_review_handler(registry)),
    )
    for path, handler in routes:
        if isinstance(app, web.Application):
            app.router.add_post(path, handler)
        else:
            app.add_route("POST", path, handler)
