"""The pod registry's own rules (kubernetes ``pkg/registry/core/pod``), beside the generic ones: a pod's spec
is immutable but for a few fields, and a pod is bound to a node through its ``binding`` subresource, once.
"""

from __future__ import annotations

from typing import Any, Final

from kubesim.apiserver.core import PODS
from kubesim.apiserver.status import FieldError, conflict, invalid
from kubesim.apiserver.storage.table import Obj

# pkg/apis/core/validation ValidatePodUpdate: what an update of a pod may change in its spec.
_MUTABLE: Final = ("activeDeadlineSeconds", "tolerations", "terminationGracePeriodSeconds", "schedulingGates")
SPEC_UPDATE_FORBIDDEN: Final = (
    "pod updates may not change fields other than `spec.containers[*].image`,`spec.initContainers[*].image`,"
    "`spec.activeDeadlineSeconds`,`spec.tolerations` (only additions to existing tolerations),"
    "`spec.terminationGracePeriodSeconds` (allow it to be set to 1 if it was previously negative)"
)
_BINDING: Final = PODS.__class__(PODS.group, PODS.version, "pods/binding", "Binding", namespaced=True)


def _without_mutable(spec: Any) -> Any:
    if not isinstance(spec, dict):
        return spec
    out = {k: v for k, v in spec.items() if k not in _MUTABLE}
    for key in ("containers", "initContainers"):
        if isinstance(out.get(key), list):
            out[key] = [
                {k: v for k, v in c.items() if k != "image"} if isinstance(c, dict) else c for c in out[key]
            ]
    return out


def check_spec_update(old: Obj, new: Obj) -> None:
    """422 when an update of a pod changes its spec beyond the fields ValidatePodUpdate allows."""
    if _without_mutable(old.get("spec")) != _without_mutable(new.get("spec")):
        name = str(new.get("metadata", {}).get("name", ""))
        raise invalid("Pod", "", name, [FieldError("spec", "Forbidden", SPEC_UPDATE_FORBIDDEN)])


def bound(pod: Obj, binding: Any) -> Obj:
    """The pod once ``binding`` (a Binding's body) is applied (pkg/registry/core/pod/storage BindingREST:
    ValidatePodBinding, then assignPod: ``spec.nodeName`` set). 422 for a binding without a target node name
    or to another kind than Node; 409 when the pod is already bound or being deleted. (assignPod also sets
    the PodScheduled condition in the same write; here the status stays the writer's of pods/status.)"""
    name = str(pod["metadata"]["name"])
    target = binding.get("target") if isinstance(binding, dict) else None
    node = target.get("name") if isinstance(target, dict) else None
    kind = target.get("kind") if isinstance(target, dict) else None
    if not isinstance(node, str) or not node:
        raise invalid("Binding", "", name, [FieldError("target.name", "Required", "")])
    if kind not in (None, "", "Node"):
        error = FieldError("target.kind", "NotSupported", 'supported values: "Node"', f'"{kind}"')
        raise invalid("Binding", "", name, [error])
    if pod["metadata"].get("deletionTimestamp"):
        raise conflict(_BINDING, name, f"pod {name} is being deleted, cannot be assigned to a host")
    current = (pod.get("spec") or {}).get("nodeName")
    if current:
        raise conflict(_BINDING, name, f'pod {name} is already assigned to node "{current}"')
    return dict(pod, spec={**(pod.get("spec") or {}), "nodeName": node})
