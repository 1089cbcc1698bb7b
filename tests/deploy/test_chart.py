"""The Helm chart, rendered and linted by the real Helm engine, validated against the Kubernetes schemas."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import helm_python as helm
import kubernetes_validate  # type: ignore[import-untyped]
import pytest
import yaml

from .chart import (
    CHART_DIR,
    FULLNAME,
    NAMESPACE,
    Rendered,
    RenderFn,
    ci_values,
    load_yaml,
    production_values,
)

# The oldest Kubernetes the chart supports (Chart.yaml kubeVersion) and the newest kubernetes-validate ships.
KUBE_VERSIONS = ["1.25", kubernetes_validate.latest_version()]
CRD_KINDS = {"ServiceMonitor", "PodMonitor", "PrometheusRule", "Certificate"}

# Values that turn each optional feature on, alone: the chart-testing values files (ci/*-values.yaml); the
# production example turns on most of them at once.
FEATURES: dict[str, dict[str, Any]] = {**ci_values(), "production": production_values()}


@pytest.fixture(scope="module", params=sorted(FEATURES), ids=sorted(FEATURES))
def feature(request: pytest.FixtureRequest, render: RenderFn) -> tuple[str, Rendered]:
    name: str = request.param
    return name, render(copy.deepcopy(FEATURES[name]))


# --- helm lint ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(FEATURES))
def test_helm_lint_strict_passes(name: str) -> None:
    report = helm.lint(CHART_DIR, copy.deepcopy(FEATURES[name]), strict=True, namespace=NAMESPACE)
    problems = [m for m in report["messages"] if m["severity"] >= 2]  # 2 warning, 3 error
    assert report["errors"] == [] and problems == [], report
    assert report["total_charts_linted"] == 1


def test_helm_lint_reports_schema_violation() -> None:
    report = helm.lint(CHART_DIR, {"replicaCount": "two"}, strict=True, namespace=NAMESPACE)
    text = " ".join(str(m["error"]) for m in report["messages"] if m["severity"] == 3) + " ".join(
        report["errors"]
    )
    assert "/replicaCount" in text and "want integer" in text, report


# --- rendered objects --------------------------------------------------------------------------------------


def test_rendered_objects_validate_against_kubernetes_schemas(feature: tuple[str, Rendered]) -> None:
    _, rendered = feature
    checked = 0
    for obj in rendered.objects:
        if obj["kind"] in CRD_KINDS:
            continue  # structural checks in test_monitoring.py
        for version in KUBE_VERSIONS:
            try:
                kubernetes_validate.validate(obj, version, strict=True)
            except kubernetes_validate.ValidationError as exc:
                path = ".".join(str(p) for p in exc.path)
                pytest.fail(
                    f"{obj['kind']}/{obj['metadata']['name']} invalid for Kubernetes {version}: {path}: "
                    f"{exc.message}"
                )
        checked += 1
    assert checked >= 5


def test_every_object_is_labelled_and_namespaced(feature: tuple[str, Rendered]) -> None:
    _, rendered = feature
    cluster_scoped = {"ClusterRole", "ClusterRoleBinding"}
    for obj in rendered.objects:
        meta = obj["metadata"]
        assert meta["labels"]["app.kubernetes.io/instance"] == "tm", meta
        assert meta["labels"]["app.kubernetes.io/managed-by"] == "Helm"
        if obj["kind"] in cluster_scoped:
            assert "namespace" not in meta
        else:
            assert meta.get("namespace"), f"{obj['kind']}/{meta['name']} has no namespace"


def test_default_install_objects(render: RenderFn) -> None:
    rendered = render()
    assert rendered.kinds() == {
        "ServiceAccount",
        "ClusterRole",
        "ClusterRoleBinding",
        "Role",
        "RoleBinding",
        "Service",
        "Deployment",
        "PodDisruptionBudget",
        "Pod",  # the `helm test` hook (test_helm_test.py)
    }
    pdb = rendered.one("PodDisruptionBudget")
    assert pdb["spec"]["minAvailable"] == 1
    assert (
        pdb["spec"]["selector"]["matchLabels"]
        == rendered.one("Deployment")["spec"]["selector"]["matchLabels"]
    )
    svc = rendered.one("Service")
    assert svc["spec"]["ports"] == [
        {"name": "http", "port": 8080, "targetPort": "http", "protocol": "TCP", "appProtocol": "http"}
    ]
    assert svc["spec"]["selector"] == rendered.one("Deployment")["spec"]["selector"]["matchLabels"]


def test_deployment_defaults(render: RenderFn) -> None:
    rendered = render()
    deploy = rendered.one("Deployment", FULLNAME)
    spec = deploy["spec"]
    pod = spec["template"]["spec"]
    c = rendered.container
    assert spec["replicas"] == 2
    assert spec["strategy"]["rollingUpdate"] == {"maxSurge": 1, "maxUnavailable": 0}
    assert c["image"] == "trainer-metrics:0.1.0"
    assert c["ports"] == [
        {"name": "http", "containerPort": 8080, "protocol": "TCP"},
        {"name": "probes", "containerPort": 8081, "protocol": "TCP"},
    ]
    # Probes go to the probe-only listener: answered even when clients fill the main port's cap.
    assert c["livenessProbe"]["httpGet"] == {"path": "/livez", "port": "probes", "scheme": "HTTP"}
    assert c["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "probes", "scheme": "HTTP"}
    assert c["resources"]["requests"] and c["resources"]["limits"]["memory"]
    # Hardened: non-root 65532, read-only root, no privilege escalation, no capabilities, seccomp.
    psc, sc = pod["securityContext"], c["securityContext"]
    assert psc["runAsNonRoot"] is True and psc["runAsUser"] == 65532
    assert psc["seccompProfile"] == {"type": "RuntimeDefault"}
    assert sc["runAsNonRoot"] is True and sc["runAsUser"] == 65532
    assert sc["readOnlyRootFilesystem"] is True
    assert sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"] == {"drop": ["ALL"]}
    assert sc["seccompProfile"] == {"type": "RuntimeDefault"}
    # /tmp is writable although the root filesystem is not.
    assert {"name": "tmp", "mountPath": "/tmp"} in c["volumeMounts"]
    assert {"name": "tmp", "emptyDir": {"sizeLimit": "64Mi"}} in pod["volumes"]
    # Time to release the Lease on SIGTERM; more than the renew deadline.
    assert pod["terminationGracePeriodSeconds"] > 10
    # A Service named trainer-metrics would otherwise inject TRAINER_METRICS_PORT=tcp://... into the pod.
    assert pod["enableServiceLinks"] is False
    assert pod["serviceAccountName"] == FULLNAME
    # Spread: preferred anti-affinity across nodes, topology spread across zones and nodes.
    anti = pod["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    selector = spec["selector"]["matchLabels"]
    assert anti[0]["podAffinityTerm"]["labelSelector"]["matchLabels"] == selector
    assert anti[0]["podAffinityTerm"]["topologyKey"] == "kubernetes.io/hostname"
    spread = pod["topologySpreadConstraints"]
    assert {t["topologyKey"] for t in spread} == {"topology.kubernetes.io/zone", "kubernetes.io/hostname"}
    assert all(t["labelSelector"]["matchLabels"] == selector for t in spread)
    assert all(t["whenUnsatisfiable"] == "ScheduleAnyway" for t in spread)


def test_downward_api_identity_and_lease_namespace(render: RenderFn) -> None:
    rendered = render()
    env_vars = {v["name"]: v for v in rendered.container["env"]}
    assert env_vars["POD_NAME"]["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.name"}}
    assert env_vars["POD_NAMESPACE"]["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.namespace"}}
    env = rendered.env(pod_name="tm-trainer-metrics-abc")
    assert env["TRAINER_METRICS_IDENTITY"] == "tm-trainer-metrics-abc"
    assert env["TRAINER_METRICS_LEASE_NAMESPACE"] == NAMESPACE
    assert env["TRAINER_METRICS_LEASE_NAME"] == FULLNAME
    assert env["TRAINER_METRICS_NAMESPACES"] == ""
    # Only the service's own settings: no auth/TLS variables unless turned on.
    assert not {"TRAINER_METRICS_AUTH_ENABLED", "TRAINER_METRICS_TLS_CERT_FILE"} & env.keys()


def test_tls_mounts_secret_and_switches_probes_to_https(render: RenderFn) -> None:
    rendered = render({"tls": {"enabled": True, "secretName": "tm-tls"}})
    c = rendered.container
    pod = rendered.one("Deployment")["spec"]["template"]["spec"]
    assert {"name": "tls", "mountPath": "/etc/trainer-metrics/tls", "readOnly": True} in c["volumeMounts"]
    tls_volume = next(v for v in pod["volumes"] if v["name"] == "tls")
    assert tls_volume["secret"]["secretName"] == "tm-tls"
    env = rendered.env()
    assert env["TRAINER_METRICS_TLS_CERT_FILE"] == "/etc/trainer-metrics/tls/tls.crt"
    assert env["TRAINER_METRICS_TLS_KEY_FILE"] == "/etc/trainer-metrics/tls/tls.key"
    # The probe listener stays plain HTTP; with it off (probe_port 0), probes use the main port, in HTTPS.
    assert c["livenessProbe"]["httpGet"] == {"path": "/livez", "port": "probes", "scheme": "HTTP"}
    no_probe_port = render({"tls": {"enabled": True, "secretName": "tm-tls"}, "config": {"probe_port": 0}})
    assert no_probe_port.container["livenessProbe"]["httpGet"] == {
        "path": "/livez",
        "port": "https",
        "scheme": "HTTPS",
    }
    assert no_probe_port.container["readinessProbe"]["httpGet"]["port"] == "https"
    # The port says what it speaks: meshes and people read the protocol from its name.
    assert c["ports"][0] == {"name": "https", "containerPort": 8080, "protocol": "TCP"}
    assert no_probe_port.container["ports"] == [c["ports"][0]]
    (port,) = rendered.one("Service")["spec"]["ports"]
    assert port == {
        "name": "https",
        "port": 8080,
        "targetPort": "https",
        "protocol": "TCP",
        "appProtocol": "https",
    }
    policy = render({"tls": {"enabled": True, "secretName": "tm-tls"}, "networkPolicy": {"enabled": True}})
    assert policy.one("NetworkPolicy")["spec"]["ingress"][0]["ports"] == [
        {"port": "https", "protocol": "TCP"}
    ]


def test_cert_manager_certificate_makes_the_secret_the_pods_mount(render: RenderFn) -> None:
    rendered = render(FEATURES["cert-manager"])
    cert = rendered.one("Certificate", FULLNAME)
    assert cert["apiVersion"] == "cert-manager.io/v1"
    assert cert["metadata"]["namespace"] == NAMESPACE
    spec = cert["spec"]
    assert spec["secretName"] == f"{FULLNAME}-tls"
    assert spec["issuerRef"] == {"name": "ca", "kind": "ClusterIssuer", "group": "cert-manager.io"}
    # The name the ServiceMonitor verifies is among the certificate's names.
    server_name = rendered.one("ServiceMonitor")["spec"]["endpoints"][0]["tlsConfig"]["serverName"]
    assert server_name in spec["dnsNames"]
    assert f"{FULLNAME}.{NAMESPACE}.svc.cluster.local" in spec["dnsNames"]
    assert spec["usages"] == ["server auth", "digital signature"]
    assert spec["privateKey"]["rotationPolicy"] == "Always"
    assert (spec["duration"], spec["renewBefore"]) == ("2160h", "360h")
    pod = rendered.one("Deployment")["spec"]["template"]["spec"]
    assert next(v for v in pod["volumes"] if v["name"] == "tls")["secret"]["secretName"] == f"{FULLNAME}-tls"
    sm_ca = rendered.one("ServiceMonitor")["spec"]["endpoints"][0]["tlsConfig"]["ca"]["secret"]
    assert sm_ca == {"name": f"{FULLNAME}-tls", "key": "ca.crt"}
    # Own Secret name, more names, other issuer kind and lifetimes.
    custom = render(
        {
            "tls": {
                "enabled": True,
                "secretName": "mine",
                "certManager": {
                    "enabled": True,
                    "issuerRef": {"name": "ns-ca", "kind": "Issuer"},
                    "extraDnsNames": ["metrics.example.com"],
                    "duration": "720h",
                    "renewBefore": "240h",
                    "clusterDomain": "corp.local",
                },
            }
        }
    ).one("Certificate")["spec"]
    assert custom["secretName"] == "mine" and custom["issuerRef"]["kind"] == "Issuer"
    assert "metrics.example.com" in custom["dnsNames"]
    assert f"{FULLNAME}.{NAMESPACE}.svc.corp.local" in custom["dnsNames"]
    assert (custom["duration"], custom["renewBefore"]) == ("720h", "240h")
    assert "Certificate" not in render({"tls": {"enabled": True, "secretName": "x"}}).kinds()


def test_pod_extras_env_from_volumes_and_sidecars(render: RenderFn) -> None:
    extras = FEATURES["extras"]
    rendered = render(extras)
    pod = rendered.one("Deployment")["spec"]["template"]["spec"]
    c = rendered.container
    assert c["envFrom"] == extras["envFrom"]
    assert extras["extraVolumeMounts"][0] in c["volumeMounts"]
    assert {"name": "tmp", "mountPath": "/tmp"} in c["volumeMounts"]  # the chart's own stay
    assert extras["extraVolumes"][0] in pod["volumes"]
    assert [x["name"] for x in pod["containers"]] == ["trainer-metrics", "log-shipper"]
    assert pod["containers"][1] == extras["extraContainers"][0]
    assert rendered.env()["HTTPS_PROXY"] == "http://proxy:3128"
    plain = render().one("Deployment")["spec"]["template"]["spec"]
    assert "envFrom" not in plain["containers"][0] and len(plain["containers"]) == 1


def test_auth_sets_env(render: RenderFn) -> None:
    assert render({"auth": {"enabled": True}}).env()["TRAINER_METRICS_AUTH_ENABLED"] == "true"


@pytest.mark.parametrize(
    ("values", "served"),
    [
        ({}, "false"),  # no auth: /debug/terminal would list every tenant's TrainJob names to anyone
        ({"auth": {"enabled": True}}, "true"),  # behind auth: only <fullname>-debug-reader subjects
        ({"config": {"debug_endpoints": True}}, "true"),  # an explicit choice wins either way
        ({"auth": {"enabled": True}, "config": {"debug_endpoints": False}}, "false"),
    ],
    ids=["default-off", "on-behind-auth", "explicitly-open", "explicitly-off"],
)
def test_debug_endpoints_default_follows_auth(render: RenderFn, values: dict[str, Any], served: str) -> None:
    rendered = render(values)
    assert rendered.env()["TRAINER_METRICS_DEBUG_ENDPOINTS"] == served
    assert ("/debug/leadership   # who holds the Lease" in rendered.notes) == (served == "true")
    open_debug = "WARNING: /debug/* is served without auth" in rendered.notes
    assert open_debug == (served == "true" and not values.get("auth"))


def test_single_replica_without_election_has_no_lease_role_nor_pdb(render: RenderFn) -> None:
    rendered = render(FEATURES["single-replica-no-election"])
    assert "PodDisruptionBudget" not in rendered.kinds()
    assert not [r for r in rendered.of_kind("Role") if r["metadata"]["name"].endswith("-lease")]
    assert rendered.env()["TRAINER_METRICS_LEADER_ELECTION"] == "false"


def test_hard_anti_affinity_and_custom_affinity(render: RenderFn) -> None:
    pod = render(FEATURES["hard-anti-affinity"]).one("Deployment")["spec"]["template"]["spec"]
    assert "requiredDuringSchedulingIgnoredDuringExecution" in pod["affinity"]["podAntiAffinity"]
    assert "topologySpreadConstraints" not in pod
    pod = render(FEATURES["custom-affinity"]).one("Deployment")["spec"]["template"]["spec"]
    assert pod["affinity"] == FEATURES["custom-affinity"]["affinity"]
    assert pod["priorityClassName"] == "system-cluster-critical"


def test_existing_service_account_is_bound_not_created(render: RenderFn) -> None:
    rendered = render(FEATURES["existing-service-account"])
    assert "ServiceAccount" not in rendered.kinds()
    assert rendered.one("Deployment")["spec"]["template"]["spec"]["serviceAccountName"] == "ops-sa"
    for binding in rendered.of_kind("RoleBinding") + rendered.of_kind("ClusterRoleBinding"):
        assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "ops-sa", "namespace": NAMESPACE}]


def test_image_digest_wins_over_tag(render: RenderFn) -> None:
    assert render(FEATURES["image-digest"]).container["image"] == "trainer-metrics@sha256:" + "a" * 64


def test_release_named_like_the_chart_keeps_short_names(render: RenderFn) -> None:
    rendered = render(name="trainer-metrics")
    assert rendered.one("Deployment")["metadata"]["name"] == "trainer-metrics"
    assert rendered.env()["TRAINER_METRICS_LEASE_NAME"] == "trainer-metrics"


def test_network_policy(render: RenderFn) -> None:
    policy = render(FEATURES["network-policy"]).one("NetworkPolicy")["spec"]
    assert policy["policyTypes"] == ["Ingress", "Egress"]
    assert policy["ingress"] == [
        {
            "ports": [{"port": "http", "protocol": "TCP"}],
            "from": FEATURES["network-policy"]["networkPolicy"]["ingressFrom"],
        },
        # The `helm test` Pod, from its namespace, only on that port.
        {
            "ports": [{"port": "http", "protocol": "TCP"}],
            "from": [
                {
                    "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": NAMESPACE}},
                    "podSelector": {
                        "matchLabels": {
                            "app.kubernetes.io/name": "trainer-metrics-test",
                            "app.kubernetes.io/instance": "tm",
                        }
                    },
                }
            ],
        },
    ]
    no_test = copy.deepcopy(FEATURES["network-policy"])
    no_test["testFramework"] = {"enabled": False}
    assert len(render(no_test).one("NetworkPolicy")["spec"]["ingress"]) == 1
    api, dns = policy["egress"]
    assert api["to"] == [{"ipBlock": {"cidr": "10.0.0.1/32"}}, {"ipBlock": {"cidr": "fd00::1/128"}}]
    assert {p["port"] for p in api["ports"]} == {443, 6443}
    assert {(p["port"], p["protocol"]) for p in dns["ports"]} == {(53, "UDP"), (53, "TCP")}


def test_notes_tell_how_to_check(render: RenderFn) -> None:
    notes = render().notes
    for needle in (
        "port-forward service/tm-trainer-metrics",
        "/readyz",
        "/metrics",
        "/debug/* (leadership",
        "helm test tm -n obs",
    ):
        assert needle in notes
    assert "helm test" not in render({"testFramework": {"enabled": False}}).notes
    assert "/debug/leadership" in render({"auth": {"enabled": True}}).notes
    notes = render(production_values()).notes
    assert "https://localhost:8080/metrics" in notes and "Authorization: Bearer" in notes
    assert 'job="trainer-metrics"' in notes and "upstream Trainer controller" in notes
    assert "placeholder" not in notes  # production sets prometheusRule.runbookBaseURL
    assert "runbookBaseURL is still the placeholder" in render({"prometheusRule": {"enabled": True}}).notes


def test_packaged_chart_renders_with_its_files(tmp_path: Path) -> None:
    # .helmignore must keep files/ (alerts, dashboard) and the schema in the archive.
    archive = helm.package(CHART_DIR, destination=tmp_path)
    with helm.Chart.load(archive) as packaged:
        assert packaged.schema is not None
        values = {"prometheusRule": {"enabled": True}, "grafanaDashboard": {"enabled": True}}
        rendered = Rendered(packaged.render(values, name="tm", namespace=NAMESPACE))
        assert rendered.one("PrometheusRule")["spec"]["groups"]
        assert rendered.one("ConfigMap")["data"]


# --- chart conventions (kube-state-metrics' chart as the reference) ---------------------------------------


def test_chart_metadata_for_repositories_and_artifacthub() -> None:
    meta = load_yaml(CHART_DIR / "Chart.yaml")
    urls = [meta["home"], *meta["sources"], meta["icon"], *(m["url"] for m in meta["maintainers"])]
    assert all(urlsplit(u).scheme == "https" and urlsplit(u).netloc for u in urls), urls
    assert all(m["name"] for m in meta["maintainers"])
    notes = meta["annotations"]
    assert notes["artifacthub.io/license"] == "Apache-2.0"
    assert notes["artifacthub.io/category"] == "monitoring-logging"
    links = yaml.safe_load(notes["artifacthub.io/links"])
    assert all(set(link) == {"name", "url"} and urlsplit(link["url"]).scheme == "https" for link in links)
    # Not part of a Kubeflow Trainer release: no such claim on any object, whatever the values.
    for name in ("default", "production"):
        for obj in render_feature(name).objects:
            assert "app.kubernetes.io/part-of" not in obj["metadata"]["labels"], obj["metadata"]["name"]


def render_feature(name: str) -> Rendered:
    with helm.Chart.load(CHART_DIR) as chart:
        return Rendered(chart.render(copy.deepcopy(FEATURES[name]), name="tm", namespace=NAMESPACE))


def test_part_of_is_the_users_to_set(render: RenderFn) -> None:
    rendered = render({"commonLabels": {"app.kubernetes.io/part-of": "ml-platform"}})
    for obj in rendered.objects:
        assert obj["metadata"]["labels"]["app.kubernetes.io/part-of"] == "ml-platform"
    pod = rendered.one("Deployment")["spec"]["template"]["metadata"]["labels"]
    assert pod["app.kubernetes.io/part-of"] == "ml-platform"


@pytest.mark.parametrize(
    ("values", "image"),
    [
        ({}, "trainer-metrics:0.1.0"),
        ({"image": {"registry": "registry.example.com"}}, "registry.example.com/trainer-metrics:0.1.0"),
        (
            {"image": {"registry": "registry.example.com/"}, "global": {"imageRegistry": "mirror:5000/ml"}},
            "mirror:5000/ml/trainer-metrics:0.1.0",
        ),
        (
            {"image": {"registry": "r.example.com", "repository": "ml/tm", "digest": "sha256:" + "b" * 64}},
            "r.example.com/ml/tm@sha256:" + "b" * 64,
        ),
    ],
    ids=["repository-alone", "registry", "global-wins", "digest"],
)
def test_image_registry_and_global_registry(render: RenderFn, values: dict[str, Any], image: str) -> None:
    rendered = render(values)
    assert rendered.container["image"] == image
    # The `helm test` Pod runs the same image.
    assert rendered.one("Pod")["spec"]["containers"][0]["image"] == image


def test_pull_secrets_global_first_each_once(render: RenderFn) -> None:
    rendered = render(FEATURES["registry-and-namespace"])
    expected = [{"name": "mirror-pull"}, {"name": "regcred"}]
    assert rendered.one("Deployment")["spec"]["template"]["spec"]["imagePullSecrets"] == expected
    assert rendered.one("Pod")["spec"]["imagePullSecrets"] == expected
    assert "imagePullSecrets" not in render().one("Deployment")["spec"]["template"]["spec"]


def test_revision_history_limit(render: RenderFn) -> None:
    assert render().one("Deployment")["spec"]["revisionHistoryLimit"] == 5
    assert render({"revisionHistoryLimit": 0}).one("Deployment")["spec"]["revisionHistoryLimit"] == 0


def test_namespace_override_applies_to_every_object_without_a_namespace_of_its_own(render: RenderFn) -> None:
    values = copy.deepcopy(FEATURES["production"])
    values["namespaceOverride"] = "ml-monitoring"
    values["watchNamespaces"] = ["team-a"]
    rendered = render(values)
    own = {  # objects placed by a value of their own
        ("ConfigMap", f"{FULLNAME}-dashboard"): "monitoring",  # grafanaDashboard.namespace
        ("Role", f"{FULLNAME}-watch"): "team-a",
        ("RoleBinding", f"{FULLNAME}-watch"): "team-a",
    }
    for obj in rendered.objects:
        meta = obj["metadata"]
        if obj["kind"] in ("ClusterRole", "ClusterRoleBinding"):
            continue
        assert meta["namespace"] == own.get((obj["kind"], meta["name"]), "ml-monitoring"), (obj["kind"], meta)
    sm = rendered.one("ServiceMonitor")
    assert sm["spec"]["namespaceSelector"] == {"matchNames": ["ml-monitoring"]}
    assert sm["spec"]["endpoints"][0]["tlsConfig"]["serverName"] == f"{FULLNAME}.ml-monitoring.svc"
    assert f"{FULLNAME}.ml-monitoring.svc" in rendered.one("Certificate")["spec"]["dnsNames"]
    assert "namespace ml-monitoring" in rendered.notes and "-n ml-monitoring" in rendered.notes
