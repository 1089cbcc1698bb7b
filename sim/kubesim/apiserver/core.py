"""The built-in kinds the simulated cluster serves besides the Trainer CRDs: Namespace, Event and Pod
(core/v1) and Lease (coordination.k8s.io/v1), with schemas written from their Go types (k8s.io/api).

The schemas drive the same walks as a CRD's (pruning of unknown fields, typing, defaults: see
:mod:`kubesim.apiserver.schema.schema`) and are published in /openapi/v2 and /openapi/v3, so kubectl explain
and client-side validation see them. Only the fields of the Go structs are listed; descriptions are short.
"""

from __future__ import annotations

from typing import Any, Final

from kubesim.apiserver.resources import ResourceKind

NAMESPACES: Final = ResourceKind("", "v1", "namespaces", "Namespace", namespaced=False)
EVENTS: Final = ResourceKind("", "v1", "events", "Event", namespaced=True)
LEASES: Final = ResourceKind("coordination.k8s.io", "v1", "leases", "Lease", namespaced=True)
PODS: Final = ResourceKind("", "v1", "pods", "Pod", namespaced=True)
BUILTIN_RESOURCES: Final = (LEASES, NAMESPACES, EVENTS, PODS)
# Built-in kinds whose status is written through their /status subresource only (pkg/registry/core/pod
# storage: a pod's status is the kubelet's; a write of the pod itself keeps the stored status).
STATUS_SUBRESOURCE: Final = frozenset((PODS,))

# A new cluster has these (kube-apiserver's system namespaces controller creates them at start).
SYSTEM_NAMESPACES: Final = ("default", "kube-node-lease", "kube-public", "kube-system")
NAMESPACE_FINALIZER: Final = "kubernetes"
NAME_LABEL: Final = "kubernetes.io/metadata.name"  # set on every namespace since 1.21

_STRING: Final = {"type": "string"}
_INT32: Final = {"type": "integer", "format": "int32"}
_TIME: Final = {"type": "string", "format": "date-time"}  # metav1.Time / MicroTime

_TYPE_META: Final = {
    "apiVersion": {"type": "string", "description": "APIVersion of this representation of the object."},
    "kind": {"type": "string", "description": "Kind of the REST resource this object represents."},
    "metadata": {"type": "object", "description": "Standard object's metadata."},
}

LEASE_SCHEMA: Final[dict[str, Any]] = {
    "type": "object",
    "description": "Lease defines a lease concept.",
    "properties": {
        **_TYPE_META,
        "spec": {
            "type": "object",
            "description": "spec contains the specification of the Lease.",
            "properties": {
                "holderIdentity": {**_STRING, "description": "the identity of the holder of the lease"},
                "leaseDurationSeconds": {
                    **_INT32,
                    "description": "duration candidates wait to force acquire",
                },
                "acquireTime": {**_TIME, "description": "when the current lease was acquired (MicroTime)"},
                "renewTime": {**_TIME, "description": "when the holder last updated the lease (MicroTime)"},
                "leaseTransitions": {**_INT32, "description": "transitions of the lease between holders"},
                "strategy": {**_STRING, "description": "the strategy for picking the leader"},
                "preferredHolder": {**_STRING, "description": "signals to a lease holder to release it"},
            },
        },
    },
}

NAMESPACE_SCHEMA: Final[dict[str, Any]] = {
    "type": "object",
    "description": "Namespace provides a scope for Names.",
    "properties": {
        **_TYPE_META,
        "spec": {
            "type": "object",
            "properties": {
                "finalizers": {
                    "type": "array",
                    "items": _STRING,
                    "x-kubernetes-list-type": "atomic",
                    "description": "Finalizers is an opaque list of values that must be empty to delete it.",
                }
            },
        },
        "status": {
            "type": "object",
            "properties": {
                "phase": {"type": "string", "enum": ["Active", "Terminating"]},
                "conditions": {
                    "type": "array",
                    "x-kubernetes-list-type": "map",
                    "x-kubernetes-list-map-keys": ["type"],
                    "items": {
                        "type": "object",
                        "required": ["type", "status"],
                        "properties": {
                            "type": _STRING,
                            "status": _STRING,
                            "lastTransitionTime": _TIME,
                            "reason": _STRING,
                            "message": _STRING,
                        },
                    },
                },
            },
        },
    },
}

_OBJECT_REFERENCE: Final = {
    "type": "object",
    "x-kubernetes-map-type": "atomic",
    "properties": {
        k: _STRING for k in ("kind", "namespace", "name", "uid", "apiVersion", "resourceVersion", "fieldPath")
    },
}

EVENT_SCHEMA: Final[dict[str, Any]] = {
    "type": "object",
    "description": "Event is a report of an event somewhere in the cluster.",
    "required": ["metadata", "involvedObject"],
    "properties": {
        **_TYPE_META,
        "involvedObject": _OBJECT_REFERENCE,
        "reason": _STRING,
        "message": _STRING,
        "source": {"type": "object", "properties": {"component": _STRING, "host": _STRING}},
        "firstTimestamp": _TIME,
        "lastTimestamp": _TIME,
        "count": _INT32,
        "type": _STRING,
        "eventTime": _TIME,
        "series": {"type": "object", "properties": {"count": _INT32, "lastObservedTime": _TIME}},
        "action": _STRING,
        "related": _OBJECT_REFERENCE,
        "reportingComponent": _STRING,
        "reportingInstance": _STRING,
    },
}

# A Pod: the fields of PodSpec and PodStatus that clients of this cluster read, typed as in k8s.io/api
# core/v1; every other field of those Go structs is kept as written (preserve-unknown-fields), not pruned: a
# real apiserver knows them all, and this schema names only a part.
_QUANTITY: Final = {"x-kubernetes-int-or-string": True}
_RESOURCE_LIST: Final = {"type": "object", "additionalProperties": _QUANTITY}
_CONTAINER: Final = {
    "type": "object",
    "required": ["name"],
    "x-kubernetes-preserve-unknown-fields": True,
    "properties": {
        "name": _STRING,
        "image": _STRING,
        "resources": {
            "type": "object",
            "x-kubernetes-preserve-unknown-fields": True,
            "properties": {"requests": _RESOURCE_LIST, "limits": _RESOURCE_LIST},
        },
        "restartPolicy": _STRING,  # init containers only: Always makes a sidecar
    },
}
_CONTAINER_STATE: Final = {
    "type": "object",
    "properties": {
        "waiting": {"type": "object", "properties": {"reason": _STRING, "message": _STRING}},
        "running": {"type": "object", "properties": {"startedAt": _TIME}},
        "terminated": {
            "type": "object",
            "required": ["exitCode"],
            "properties": {
                "exitCode": _INT32,
                "signal": _INT32,
                "reason": _STRING,
                "message": _STRING,
                "startedAt": _TIME,
                "finishedAt": _TIME,
                "containerID": _STRING,
            },
        },
    },
}
_CONTAINER_STATUS: Final = {
    "type": "object",
    "required": ["name", "ready", "restartCount", "image", "imageID"],
    "x-kubernetes-preserve-unknown-fields": True,
    "properties": {
        "name": _STRING,
        "state": _CONTAINER_STATE,
        "lastState": _CONTAINER_STATE,
        "ready": {"type": "boolean"},
        "restartCount": _INT32,
        "image": _STRING,
        "imageID": _STRING,
    },
}
POD_SCHEMA: Final[dict[str, Any]] = {
    "type": "object",
    "description": "Pod is a collection of containers that can run on a host.",
    "properties": {
        **_TYPE_META,
        "spec": {
            "type": "object",
            "required": ["containers"],
            "x-kubernetes-preserve-unknown-fields": True,
            "properties": {
                "containers": {"type": "array", "items": _CONTAINER},
                "initContainers": {"type": "array", "items": _CONTAINER},
                "nodeName": _STRING,
                "restartPolicy": {"type": "string", "enum": ["Always", "OnFailure", "Never"]},
                "schedulerName": _STRING,
                "hostname": _STRING,
                "subdomain": _STRING,
            },
        },
        "status": {
            "type": "object",
            "x-kubernetes-preserve-unknown-fields": True,
            "properties": {
                "phase": {"type": "string", "enum": ["Pending", "Running", "Succeeded", "Failed", "Unknown"]},
                "reason": _STRING,
                "message": _STRING,
                "hostIP": _STRING,
                "podIP": _STRING,
                "startTime": _TIME,
                "qosClass": _STRING,
                "conditions": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "required": ["type", "status"],
                        "properties": {
                            "type": _STRING,
                            "status": _STRING,
                            "reason": _STRING,
                            "message": _STRING,
                            "lastTransitionTime": _TIME,
                        },
                    },
                },
                "containerStatuses": {"type": "array", "items": _CONTAINER_STATUS},
                "initContainerStatuses": {"type": "array", "items": _CONTAINER_STATUS},
            },
        },
    },
}

BUILTIN_SCHEMAS: Final[dict[ResourceKind, dict[str, Any]]] = {
    LEASES: LEASE_SCHEMA,
    NAMESPACES: NAMESPACE_SCHEMA,
    EVENTS: EVENT_SCHEMA,
    PODS: POD_SCHEMA,
}

# Go struct names for decode errors ("json: cannot unmarshal ... into Go struct field LeaseSpec.spec.x").
GO_STRUCTS: Final[dict[str, str]] = {
    "Lease.spec": "LeaseSpec",
    "Namespace.spec": "NamespaceSpec",
    "Namespace.status": "NamespaceStatus",
    "Event.involvedObject": "ObjectReference",
    "Event.related": "ObjectReference",
    "Event.source": "EventSource",
    "Event.series": "EventSeries",
    "Pod.spec": "PodSpec",
    "Pod.status": "PodStatus",
}

# Table columns of the built-in kinds (pkg/printers/internalversion/printers.go), as (name, type, path).
PRINTER_COLUMNS: Final[dict[ResourceKind, list[dict[str, Any]]]] = {
    LEASES: [
        {"name": "Holder", "type": "string", "jsonPath": ".spec.holderIdentity"},
        {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
    ],
    NAMESPACES: [
        {"name": "Status", "type": "string", "jsonPath": ".status.phase"},
        {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
    ],
    PODS: [
        {"name": "Status", "type": "string", "jsonPath": ".status.phase"},
        {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
        {"name": "Node", "type": "string", "jsonPath": ".spec.nodeName", "priority": 1},
    ],
    EVENTS: [
        {"name": "Last Seen", "type": "date", "jsonPath": ".lastTimestamp"},
        {"name": "Type", "type": "string", "jsonPath": ".type"},
        {"name": "Reason", "type": "string", "jsonPath": ".reason"},
        {"name": "Object", "type": "string", "jsonPath": ".involvedObject.name"},
        {"name": "Message", "type": "string", "jsonPath": ".message"},
    ],
}

SHORT_NAMES: Final[dict[ResourceKind, list[str]]] = {NAMESPACES: ["ns"], EVENTS: ["ev"], PODS: ["po"]}
