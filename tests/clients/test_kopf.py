"""kopf: a small operator (``kopf run --standalone``) handles a TrainJob's creation within 20 s. kopf reads
discovery for the CRD (and /api/v1 for namespaces), watches, patches its progress annotations and finalizer,
and posts Events; before namespaces were in the core discovery it waited forever without an error."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from .conftest import Cluster, calling, stop_process, trainjob

KOPF = "kopf"
NS = "clients-kopf"
OPERATOR = textwrap.dedent(
    """
    import kopf

    @kopf.on.startup()
    def configure(settings, **_):
        settings.watching.server_timeout = 10
        settings.watching.client_timeout = 15
        settings.persistence.finalizer = "clients.sim.example/kopf"

    @kopf.on.create("trainer.kubeflow.org", "v1alpha1", "trainjobs")
    def created(body, name, namespace, patch, logger, **_):
        patch.metadata.labels["handled-by"] = "kopf"
        kopf.info(body, reason="Handled", message=f"handled {namespace}/{name}")  # a core/v1 Event
    """
)


def test_kopf_operator_handles_a_trainjob_creation(cluster: Cluster, tmp_path: Path) -> None:
    from kubernetes import client, config

    operator = tmp_path / "operator.py"
    operator.write_text(OPERATOR)
    log = (tmp_path / "kopf.log").open("wb")
    env = dict(os.environ, KUBECONFIG=str(cluster.kubeconfig))
    kopf = Path(sys.executable).parent / "kopf"
    proc = subprocess.Popen(
        [str(kopf), "run", "--standalone", "--namespace", NS, "--verbose", str(operator)],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    api_client = config.new_client_from_config(config_file=str(cluster.kubeconfig))
    crd = client.CustomObjectsApi(api_client)
    try:
        time.sleep(2)  # let the operator start its watch (a create before it is handled all the same)
        with calling(KOPF, "run --standalone (operator process alive)"):
            assert proc.poll() is None, (tmp_path / "kopf.log").read_text()[-3000:]
        crd.create_namespaced_custom_object(
            "trainer.kubeflow.org", "v1alpha1", NS, "trainjobs", trainjob("for-kopf", NS)
        )
        with calling(KOPF, "@kopf.on.create handler runs within 20 s"):
            deadline = time.monotonic() + 20
            labels: dict[str, str] = {}
            while time.monotonic() < deadline:
                obj = crd.get_namespaced_custom_object(
                    "trainer.kubeflow.org", "v1alpha1", NS, "trainjobs", "for-kopf"
                )
                labels = obj["metadata"].get("labels") or {}
                if labels.get("handled-by") == "kopf":
                    break
                time.sleep(0.3)
            assert labels.get("handled-by") == "kopf", (tmp_path / "kopf.log").read_text()[-3000:]
        with calling(KOPF, "posted Events for the TrainJob"):
            deadline = time.monotonic() + 10
            names: list[str] = []
            while time.monotonic() < deadline and "for-kopf" not in names:
                events = client.CoreV1Api(api_client).list_namespaced_event(NS)
                names = [e.involved_object.name for e in events.items]
                time.sleep(0.3)
            assert "for-kopf" in names, (tmp_path / "kopf.log").read_text()[-3000:]
    finally:
        stop_process(proc, 15.0)
        log.close()
        api_client.close()
