"""/openapi/v2 and /openapi/v3 of the simulated apiserver, built from the schemas of the kinds it serves (the
CRDs' openAPIV3Schema, the built-in kinds' schemas from kubesim.apiserver.core).

kubectl needs them: ``explain``, client-side validation (kubectl <= 1.26 reads v2, as protobuf only) and
the check that the server supports ``fieldValidation`` (kubectl >= 1.27 reads the PATCH operation's
parameters in the v3 document of the kind's group-version). Definitions are named like the apiserver's
(``org.kubeflow.trainer.v1alpha1.TrainJob``, ``io.k8s.api.coordination.v1.Lease``) and carry
``x-kubernetes-group-version-kind``. In v2, the schemas lose what Swagger 2.0 cannot say (nullable, anyOf),
as the apiserver's CRD publishing does. The protobuf form of v2 is :mod:`kubesim.apiserver.http.openapi_pb`'s.
"""

from __future__ import annotations

import copy
import hashlib
from typing import Any, Final

import orjson

from kubesim.apiserver.http.discovery import VERSION
from kubesim.apiserver.http.openapi_pb import v2_protobuf
from kubesim.apiserver.resources import ResourceKind
from kubesim.apiserver.storage.strategy import ResourceSchema

Doc = dict[str, Any]
META: Final = "io.k8s.apimachinery.pkg.apis.meta.v1"
_BUILTIN_PACKAGES: Final = {"": "io.k8s.api.core", "coordination.k8s.io": "io.k8s.api.coordination"}
PARAMS: Final = ("dryRun", "fieldManager", "fieldValidation", "pretty")


def definition_name(res: ResourceKind, kind: str | None = None) -> str:
    kind = kind or res.kind
    if res.group in _BUILTIN_PACKAGES:
        return f"{_BUILTIN_PACKAGES[res.group]}.{res.version}.{kind}"
    return ".".join(reversed(res.group.split("."))) + f".{res.version}.{kind}"


def _gvk(res: ResourceKind, kind: str | None = None) -> list[dict[str, str]]:
    return [{"group": res.group, "kind": kind or res.kind, "version": res.version}]


def _meta_definitions(ref: str) -> dict[str, Doc]:
    string = {"type": "string"}
    return {
        f"{META}.ObjectMeta": {
            "description": "ObjectMeta is metadata that all persisted resources must have.",
            "type": "object",
            "properties": {
                "name": string,
                "generateName": string,
                "namespace": string,
                "uid": string,
                "resourceVersion": string,
                "generation": {"type": "integer", "format": "int64"},
                "creationTimestamp": {"type": "string", "format": "date-time"},
                "deletionTimestamp": {"type": "string", "format": "date-time"},
                "deletionGracePeriodSeconds": {"type": "integer", "format": "int64"},
                "labels": {"type": "object", "additionalProperties": string},
                "annotations": {"type": "object", "additionalProperties": string},
                "finalizers": {"type": "array", "items": string},
                "ownerReferences": {"type": "array", "items": {"type": "object"}},
                "managedFields": {"type": "array", "items": {"type": "object"}},
            },
        },
        f"{META}.ListMeta": {
            "type": "object",
            "properties": {
                "continue": string,
                "remainingItemCount": {"type": "integer", "format": "int64"},
                "resourceVersion": string,
            },
        },
        f"{META}.Status": {
            "type": "object",
            "properties": {
                "apiVersion": string,
                "kind": string,
                "code": {"type": "integer", "format": "int32"},
                "message": string,
                "reason": string,
                "status": string,
                "metadata": {"$ref": f"{ref}{META}.ListMeta"},
            },
            "x-kubernetes-group-version-kind": [{"group": "", "kind": "Status", "version": "v1"}],
        },
    }


def _to_v2(schema: Any) -> Any:
    """Swagger 2.0 has no nullable, anyOf/oneOf/not: drop them (and the type of int-or-string fields)."""
    if isinstance(schema, list):
        return [_to_v2(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out: Doc = {}
    for k, v in schema.items():
        if k in ("nullable", "anyOf", "oneOf", "not", "allOf", "x-kubernetes-validations"):
            continue
        if k == "properties":
            out[k] = {pk: _to_v2(pv) for pk, pv in v.items()}
        elif k in ("items", "additionalProperties"):
            out[k] = _to_v2(v)
        else:
            out[k] = v
    if schema.get("x-kubernetes-int-or-string") or schema.get("nullable"):
        out.pop("type", None)
    return out


def _definitions(schemas: list[ResourceSchema], ref: str, v2: bool) -> dict[str, Doc]:
    defs = _meta_definitions(ref)
    for s in schemas:
        res = s.resource
        body = copy.deepcopy(s.openapi or {"type": "object"})
        if v2:
            body = _to_v2(body)
        props = body.setdefault("properties", {})
        props["metadata"] = {"$ref": f"{ref}{META}.ObjectMeta"}
        body["x-kubernetes-group-version-kind"] = _gvk(res)
        defs[definition_name(res)] = body
        defs[definition_name(res, s.list_kind)] = {
            "description": f"{s.list_kind} is a list of {res.kind}",
            "type": "object",
            "required": ["items"],
            "properties": {
                "apiVersion": {"type": "string"},
                "kind": {"type": "string"},
                "items": {"type": "array", "items": {"$ref": f"{ref}{definition_name(res)}"}},
                "metadata": {"$ref": f"{ref}{META}.ListMeta"},
            },
            "x-kubernetes-group-version-kind": _gvk(res, s.list_kind),
        }
    return defs


def _operation(  # noqa: PLR0917 - one call site per operation
    action: str, s: ResourceSchema, op_id: str, ref: str, v3: bool, body: bool
) -> Doc:
    res = s.resource
    params: list[Doc] = []
    if action in ("post", "put", "patch"):
        names = [*PARAMS, "force"] if action == "patch" else PARAMS
        params = [_query_param(n, v3) for n in names]
    if body and not v3:
        params.append({"name": "body", "in": "body", "required": True, "schema": {"type": "object"}})
    target = f"{ref}{definition_name(res)}"
    op: Doc = {
        "operationId": op_id,
        "tags": [res.group.replace(".", "") + "_" + res.version if res.group else "core_" + res.version],
        "parameters": params,
        "responses": _responses(target, v3),
        "x-kubernetes-action": action,
        "x-kubernetes-group-version-kind": _gvk(res)[0],
    }
    if body and v3:
        op["requestBody"] = {"content": {"application/json": {"schema": {"$ref": target}}}, "required": True}
    return op


def _query_param(name: str, v3: bool) -> Doc:
    if v3:
        return {"name": name, "in": "query", "schema": {"type": "boolean" if name == "force" else "string"}}
    return {
        "name": name,
        "in": "query",
        "type": "boolean" if name == "force" else "string",
        "uniqueItems": True,
    }


def _responses(target: str, v3: bool) -> Doc:
    if v3:
        return {"200": {"description": "OK", "content": {"application/json": {"schema": {"$ref": target}}}}}
    return {"200": {"description": "OK", "schema": {"$ref": target}}}


def _paths(schemas: list[ResourceSchema], ref: str, v3: bool) -> Doc:
    paths: Doc = {}
    for s in schemas:
        res = s.resource
        base = f"/apis/{res.group}/{res.version}" if res.group else f"/api/{res.version}"
        coll = f"{base}/namespaces/{{namespace}}/{res.plural}" if res.namespaced else f"{base}/{res.plural}"
        k = res.kind
        kind_id = f"{res.group.split('.')[0].title()}{res.version.title()}" if res.group else "CoreV1"
        ns = "Namespaced" if res.namespaced else ""
        paths[coll] = {
            "get": _operation("list", s, f"list{kind_id}{ns}{k}", ref, v3, False),
            "post": _operation("post", s, f"create{kind_id}{ns}{k}", ref, v3, True),
            "delete": _operation("deletecollection", s, f"deleteCollection{kind_id}{ns}{k}", ref, v3, False),
        }
        obj = f"{coll}/{{name}}"
        paths[obj] = {
            "get": _operation("get", s, f"read{kind_id}{ns}{k}", ref, v3, False),
            "put": _operation("put", s, f"replace{kind_id}{ns}{k}", ref, v3, True),
            "patch": _operation("patch", s, f"patch{kind_id}{ns}{k}", ref, v3, True),
            "delete": _operation("delete", s, f"delete{kind_id}{ns}{k}", ref, v3, False),
        }
        if s.status_subresource:
            paths[f"{obj}/status"] = {
                "get": _operation("get", s, f"read{kind_id}{ns}{k}Status", ref, v3, False),
                "put": _operation("put", s, f"replace{kind_id}{ns}{k}Status", ref, v3, True),
                "patch": _operation("patch", s, f"patch{kind_id}{ns}{k}Status", ref, v3, True),
            }
        if res.namespaced:
            paths[f"{base}/{res.plural}"] = {
                "get": _operation("list", s, f"list{kind_id}{k}ForAllNamespaces", ref, v3, False)
            }
    return paths


def _info() -> Doc:
    return {"title": "Kubernetes", "version": VERSION["gitVersion"]}


def v2_document(schemas: list[ResourceSchema]) -> Doc:
    ref = "#/definitions/"
    return {
        "swagger": "2.0",
        "info": _info(),
        "paths": _paths(schemas, ref, False),
        "definitions": _definitions(schemas, ref, True),
    }


def group_versions(schemas: list[ResourceSchema]) -> dict[str, list[ResourceSchema]]:
    out: dict[str, list[ResourceSchema]] = {}
    for s in schemas:
        res = s.resource
        key = f"apis/{res.group}/{res.version}" if res.group else f"api/{res.version}"
        out.setdefault(key, []).append(s)
    return out


def v3_group_version(schemas: list[ResourceSchema]) -> Doc:
    ref = "#/components/schemas/"
    return {
        "openapi": "3.0.0",
        "info": _info(),
        "paths": _paths(schemas, ref, True),
        "components": {"schemas": _definitions(schemas, ref, False)},
    }


def v3_root(schemas: list[ResourceSchema]) -> Doc:
    paths = {}
    for key, members in group_versions(schemas).items():
        digest = hashlib.sha512(orjson.dumps(v3_group_version(members))).hexdigest().upper()[:128]
        paths[key] = {"serverRelativeURL": f"/openapi/v3/{key}?hash={digest}"}
    return {"paths": paths}


def documents(schemas: list[ResourceSchema]) -> tuple[bytes, bytes, bytes, dict[str, bytes]]:
    """(v2 JSON, v2 protobuf, v3 root JSON, v3 per group-version JSON); the server builds them once."""
    v2 = v2_document(schemas)
    per_gv = {k: orjson.dumps(v3_group_version(v)) for k, v in group_versions(schemas).items()}
    return orjson.dumps(v2), v2_protobuf(v2), orjson.dumps(v3_root(schemas)), per_gv
