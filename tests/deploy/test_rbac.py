"""RBAC: what the service account may do is exactly the least-privilege set, no more, no less."""

from __future__ import annotations

from .chart import FULLNAME, NAMESPACE, SERVICE_ACCOUNT, Rendered, RenderFn, iter_rules

TRAINER = "trainer.kubeflow.org"
READ = ("get", "list", "watch")
CORE = ""  # the core API group: pods, for the pod series (config.pod_series, on by default)
CLUSTER = "*"  # the scope of a ClusterRole bound by a ClusterRoleBinding

# (scope namespace or CLUSTER, apiGroup, resource, verb, resourceName or "*")
Grant = tuple[str, str, str, str, str]


def grants_of_service_account(
    rendered: Rendered, sa: str = SERVICE_ACCOUNT, sa_ns: str = NAMESPACE
) -> set[Grant]:
    """Everything the bindings in the release give the service account, flattened."""
    roles = {
        (o["kind"], o["metadata"].get("namespace", ""), o["metadata"]["name"]): o
        for o in rendered.of_kind("Role") + rendered.of_kind("ClusterRole")
    }
    grants: set[Grant] = set()
    for binding in rendered.of_kind("RoleBinding") + rendered.of_kind("ClusterRoleBinding"):
        subjects = binding["subjects"]
        if {"kind": "ServiceAccount", "name": sa, "namespace": sa_ns} not in subjects:
            continue
        assert len(subjects) == 1, f"{binding['metadata']['name']} binds more than the service account"
        ref = binding["roleRef"]
        assert ref["apiGroup"] == "rbac.authorization.k8s.io"
        bind_ns = binding["metadata"].get("namespace", "")
        role_ns = bind_ns if ref["kind"] == "Role" else ""
        role = roles[(ref["kind"], role_ns, ref["name"])]  # a dangling roleRef fails here
        scope = bind_ns if binding["kind"] == "RoleBinding" else CLUSTER
        for rule in role["rules"]:
            assert "nonResourceURLs" not in rule, (
                f"{role['metadata']['name']} gives the service a non-resource URL"
            )
            for group in rule["apiGroups"]:
                for resource in rule["resources"]:
                    for verb in rule["verbs"]:
                        for name in rule.get("resourceNames") or ["*"]:
                            grants.add((scope, group, resource, verb, name))
    return grants


def expand(
    scope: str, group: str, resources: tuple[str, ...], verbs: tuple[str, ...], name: str = "*"
) -> set[Grant]:
    return {(scope, group, r, v, name) for r in resources for v in verbs}


def lease_grants(lease: str = FULLNAME) -> set[Grant]:
    return expand(NAMESPACE, "coordination.k8s.io", ("leases",), ("create",)) | expand(
        NAMESPACE, "coordination.k8s.io", ("leases",), ("get", "update"), lease
    )


def test_no_wildcards_anywhere(render: RenderFn) -> None:
    rendered = render({"auth": {"enabled": True}, "watchNamespaces": ["a"]})
    for role, rule in iter_rules(rendered.objects):
        for key in ("apiGroups", "resources", "verbs", "resourceNames"):
            assert "*" not in rule.get(key, []), f"{role['metadata']['name']}: {key} has *"
        assert set(rule["verbs"]) <= {"get", "list", "watch", "create", "update"}, rule


def test_default_all_namespaces(render: RenderFn) -> None:
    rendered = render()
    assert grants_of_service_account(rendered) == (
        expand(CLUSTER, TRAINER, ("trainjobs", "trainingruntimes", "clustertrainingruntimes"), READ)
        | expand(CLUSTER, CORE, ("pods",), READ)
        | lease_grants()
    )
    cluster_roles = rendered.of_kind("ClusterRole")
    assert [r["metadata"]["name"] for r in cluster_roles] == [FULLNAME]
    assert cluster_roles[0]["rules"] == [
        {
            "apiGroups": [TRAINER],
            "resources": ["trainjobs", "trainingruntimes", "clustertrainingruntimes"],
            "verbs": ["get", "list", "watch"],
        },
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]},
    ]


def test_pod_series_off_grants_no_pods(render: RenderFn) -> None:
    for values in ({}, {"watchNamespaces": ["team-a"]}):
        rendered = render({**values, "config": {"pod_series": False}})
        assert not {g for g in grants_of_service_account(rendered) if g[2] == "pods"}
        assert rendered.env()["TRAINER_METRICS_POD_SERIES"] == "false"


def test_lease_role_restricted_by_name_except_create(render: RenderFn) -> None:
    role = render().one("Role", f"{FULLNAME}-lease")
    assert role["metadata"]["namespace"] == NAMESPACE
    assert role["rules"] == [
        # A create is a POST to the collection: its URL carries no name, so resourceNames cannot match it.
        {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["create"]},
        {
            "apiGroups": ["coordination.k8s.io"],
            "resources": ["leases"],
            "resourceNames": [FULLNAME],
            "verbs": ["get", "update"],
        },
    ]


def test_lease_name_follows_the_value(render: RenderFn) -> None:
    rendered = render({"leaderElection": {"leaseName": "my-lock"}})
    assert rendered.env()["TRAINER_METRICS_LEASE_NAME"] == "my-lock"
    assert lease_grants("my-lock") <= grants_of_service_account(rendered)


def test_lease_role_unrestricted_when_asked(render: RenderFn) -> None:
    rendered = render({"rbac": {"restrictLeaseByName": False}})
    assert {g for g in grants_of_service_account(rendered) if g[2] == "leases"} == expand(
        NAMESPACE, "coordination.k8s.io", ("leases",), ("get", "create", "update")
    )


def test_watch_namespaces_uses_roles_per_namespace(render: RenderFn) -> None:
    rendered = render({"watchNamespaces": ["team-a", "team-b"]})
    assert grants_of_service_account(rendered) == (
        expand(CLUSTER, TRAINER, ("clustertrainingruntimes",), READ)
        | expand("team-a", TRAINER, ("trainjobs", "trainingruntimes"), READ)
        | expand("team-b", TRAINER, ("trainjobs", "trainingruntimes"), READ)
        | expand("team-a", CORE, ("pods",), READ)
        | expand("team-b", CORE, ("pods",), READ)
        | lease_grants()
    )
    assert rendered.env()["TRAINER_METRICS_NAMESPACES"] == "team-a,team-b"
    assert sorted(r["metadata"]["namespace"] for r in rendered.of_kind("Role")) == ["obs", "team-a", "team-b"]


def test_auth_adds_reviews_and_a_metrics_reader(render: RenderFn) -> None:
    subjects = [{"kind": "ServiceAccount", "name": "prometheus-k8s", "namespace": "monitoring"}]
    rendered = render({"auth": {"enabled": True, "metricsReaderSubjects": subjects}})
    assert grants_of_service_account(rendered) == (
        expand(CLUSTER, TRAINER, ("trainjobs", "trainingruntimes", "clustertrainingruntimes"), READ)
        | expand(CLUSTER, CORE, ("pods",), READ)
        | lease_grants()
        | {
            (CLUSTER, "authentication.k8s.io", "tokenreviews", "create", "*"),
            (CLUSTER, "authorization.k8s.io", "subjectaccessreviews", "create", "*"),
        }
    )
    reader = rendered.one("ClusterRole", f"{FULLNAME}-metrics-reader")
    assert reader["rules"] == [{"nonResourceURLs": ["/metrics"], "verbs": ["get"]}]
    debug_reader = rendered.one("ClusterRole", f"{FULLNAME}-debug-reader")
    # /debug/* lists TrainJob names across tenants; the API docs are behind the same role.
    assert debug_reader["rules"] == [
        {"nonResourceURLs": ["/debug/*", "/docs", "/docs/*", "/openapi.json"], "verbs": ["get"]}
    ]
    assert not [
        b for b in rendered.of_kind("ClusterRoleBinding") if b["metadata"]["name"].endswith("-debug-reader")
    ]
    binding = rendered.one("ClusterRoleBinding", f"{FULLNAME}-metrics-reader")
    assert binding["roleRef"]["name"] == f"{FULLNAME}-metrics-reader"
    assert binding["subjects"] == subjects


def test_debug_reader_subjects_are_bound(render: RenderFn) -> None:
    oncall = [{"kind": "Group", "name": "oncall", "apiGroup": "rbac.authorization.k8s.io"}]
    rendered = render({"auth": {"enabled": True, "debugReaderSubjects": oncall}})
    binding = rendered.one("ClusterRoleBinding", f"{FULLNAME}-debug-reader")
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "ClusterRole",
        "name": f"{FULLNAME}-debug-reader",
    }
    assert binding["subjects"] == oncall
    # Nothing to bind to without auth: the roles only mean something to the service's SubjectAccessReview.
    assert "ClusterRoleBinding" not in {
        o["kind"]
        for o in render({"auth": {"debugReaderSubjects": oncall}}).objects
        if "reader" in o["metadata"]["name"]
    }


def test_auth_without_reader_subjects_binds_nobody(render: RenderFn) -> None:
    rendered = render({"auth": {"enabled": True}})
    rendered.one("ClusterRole", f"{FULLNAME}-metrics-reader")
    assert not [
        b for b in rendered.of_kind("ClusterRoleBinding") if b["metadata"]["name"].endswith("-reader")
    ]


def test_no_auth_roles_without_auth(render: RenderFn) -> None:
    names = {o["metadata"]["name"] for o in render().of_kind("ClusterRole")}
    assert names == {FULLNAME}


def test_rbac_create_false_renders_no_rbac(render: RenderFn) -> None:
    rendered = render({"rbac": {"create": False}, "auth": {"enabled": True}})
    kinds = rendered.kinds()
    assert not {"Role", "RoleBinding", "ClusterRoleBinding"} & kinds
    # Only the reader role for scrapers remains (it grants nothing to the service).
    assert [o["metadata"]["name"] for o in rendered.of_kind("ClusterRole")] == [
        f"{FULLNAME}-metrics-reader",
        f"{FULLNAME}-debug-reader",
    ]


def test_namespaced_install_has_no_cluster_scoped_rbac(render: RenderFn) -> None:
    values = {"watchNamespaces": ["team-a", "team-b"], "watchClusterRuntimes": False}
    for extra in ({}, {"rbac": {"useClusterRole": False}}):
        rendered = render({**values, **extra})
        assert not {"ClusterRole", "ClusterRoleBinding"} & rendered.kinds()
        assert grants_of_service_account(rendered) == (
            expand("team-a", TRAINER, ("trainjobs", "trainingruntimes"), READ)
            | expand("team-b", TRAINER, ("trainjobs", "trainingruntimes"), READ)
            | expand("team-a", CORE, ("pods",), READ)
            | expand("team-b", CORE, ("pods",), READ)
            | lease_grants()
        )
        assert rendered.env()["TRAINER_METRICS_WATCH_CLUSTER_RUNTIMES"] == "false"
        assert "team-a, team-b (not ClusterTrainingRuntimes" in rendered.notes
    # The service then builds no ClusterTrainingRuntime informer (tests/integration/test_cluster_runtimes.py).


def test_all_namespaces_without_cluster_runtimes(render: RenderFn) -> None:
    rendered = render({"watchClusterRuntimes": False})
    assert grants_of_service_account(rendered) == (
        expand(CLUSTER, TRAINER, ("trainjobs", "trainingruntimes"), READ)
        | expand(CLUSTER, CORE, ("pods",), READ)
        | lease_grants()
    )


def test_namespace_override_moves_the_service_account_its_bindings_and_the_lease(render: RenderFn) -> None:
    rendered = render({"namespaceOverride": "ml-monitoring", "watchNamespaces": ["team-a"]})
    assert rendered.one("ServiceAccount")["metadata"]["namespace"] == "ml-monitoring"
    grants = grants_of_service_account(rendered, sa_ns="ml-monitoring")
    assert ("team-a", TRAINER, "trainjobs", "watch", "*") in grants
    assert {g for g in grants if g[2] == "leases"} == {
        ("ml-monitoring", *g[1:]) for g in lease_grants()
    }  # the Role of the Lease is where the pods run: the Lease namespace is the pod's (downward API)
