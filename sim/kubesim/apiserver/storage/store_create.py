"""The create path of the registry: admission of a new object (type meta, name or generateName, the
namespace existing and not terminating, no duplicate), server-set metadata, managedFields and the
namespace registry's defaults, before the one commit in :mod:`kubesim.apiserver.storage.store_core`.
"""

from __future__ import annotations

from kubesim.apiserver.core import NAME_LABEL, NAMESPACE_FINALIZER, NAMESPACES, PODS
from kubesim.apiserver.resources import ResourceKind
from kubesim.apiserver.schema.validation import KindValidator, WriteOptions, serializable
from kubesim.apiserver.status import FieldError, StoreError, already_exists, invalid, not_found
from kubesim.apiserver.storage.managed_fields import record_update
from kubesim.apiserver.storage.store_core import TRUSTED, StoreCore
from kubesim.apiserver.storage.strategy import (
    FROM_BODY,
    assemble,
    check_namespace,
    create_metadata,
    generated_name,
    now_rfc3339,
    own,
)
from kubesim.apiserver.storage.table import Obj


class StoreCreates(StoreCore):
    """Creates (see :class:`kubesim.apiserver.storage.store.Store`)."""

    # -- writes -------------------------------------------------------------------------------
    # Every write takes ``opts``: None (Python callers) writes as given; the HTTP layer and the workload
    # generator pass WriteOptions and get the apiserver's checks (kubesim.apiserver.schema.validation), dry
    # runs and warnings.
    def create(
        self,
        resource: ResourceKind,
        namespace: str | None,
        obj: Obj,
        *,
        field_manager: str = "sim",
        copy: bool = True,
        opts: WriteOptions | None = None,
        operation: str = "Update",
    ) -> Obj:
        """Create ``obj``. Returns a private copy of the stored object, or with ``copy=False`` the stored
        object itself: shared and read-only (for callers that never mutate it, like the generator)."""
        resource = self.served(resource)
        opts = opts or TRUSTED
        schema, table = self._kind(resource)
        body = own(obj)
        validator = schema.validator if opts.validate else None
        if validator is not None:
            validator.check_type_meta(body)
            validator.decode(body, None, opts)
        meta = body.get("metadata")
        if not isinstance(meta, dict):
            meta = {}
        namespace = check_namespace(resource, namespace, meta)
        name = meta.get("name") or ""
        if not name and meta.get("generateName"):
            name = generated_name(meta["generateName"])
        if not name:
            raise name_required(resource, "name or generateName is required")
        if meta.get("resourceVersion"):
            raise StoreError.make(
                500, "InternalError", "resourceVersion should not be set on objects to be created"
            )
        if namespace is not None:
            self._check_namespace(namespace, opts)
        if (namespace or "", name) in table.index:
            raise already_exists(resource, name)
        now = now_rfc3339()
        new_meta = create_metadata(schema, namespace, name, meta, now)
        # With a status subresource, a create drops the body's status.
        new_obj = assemble(
            schema,
            body,
            new_meta,
            status=None if schema.status_subresource else FROM_BODY,
            defaults=validator is None,
        )
        if resource == NAMESPACES:
            namespace_defaults(new_obj)
        elif resource == PODS:
            # pkg/registry/core/pod/strategy.go PrepareForCreate: a new pod's status is the registry's:
            # Pending (the kubelet writes the rest, through pods/status).
            new_obj["status"] = {"phase": "Pending"}
        if validator is not None:
            validator.validate(new_obj, None)
        node = self._node(schema)
        managed = record_update(
            [],
            manager=field_manager,
            resource=resource,
            node=node,
            old=None,
            new=new_obj,
            subresource=None,
            status_subresource=schema.status_subresource,
            when=now,
        )
        if operation == "Apply":
            managed = [dict(m, operation="Apply") for m in managed]
        new_meta["managedFields"] = managed
        if opts.dry_run:
            serializable(new_obj, resource.kind)
            del new_meta["resourceVersion"]  # never stored: no revision (etcd3 PrepareObjectForStorage)
            return new_obj
        entry = self._commit(resource, "ADDED", new_obj, None, checked=bounded(validator))
        return entry.copy() if copy else entry.obj

    def _check_namespace(self, namespace: str, opts: WriteOptions) -> None:
        table = self._tables.get(NAMESPACES)
        if table is None:
            return
        ns = table.index.get(("", namespace))
        if ns is None:
            if opts.require_namespace:
                raise not_found(NAMESPACES, namespace)
            self.create(NAMESPACES, None, {"metadata": {"name": namespace}}, field_manager="kube-apiserver")
        elif ns.obj["metadata"].get("deletionTimestamp"):
            err = StoreError.make(
                403,
                "Forbidden",
                f"unable to create new content in namespace {namespace} because it is being terminated",
                {
                    "name": namespace,
                    "kind": "namespaces",
                    "causes": [
                        {
                            "reason": "NamespaceTerminating",
                            "message": f"namespace {namespace} is being terminated",
                            "field": "metadata.namespace",
                        }
                    ],
                },
            )
            raise err


def bounded(validator: KindValidator | None) -> bool:
    return validator is not None and validator.schema.bounded


def namespace_defaults(obj: Obj) -> None:
    """What the namespace registry sets on create: the name label, the kubernetes finalizer, phase Active."""
    meta = obj["metadata"]
    meta["labels"] = {**(meta.get("labels") or {}), NAME_LABEL: meta["name"]}
    spec = obj.setdefault("spec", {})
    spec.setdefault("finalizers", [NAMESPACE_FINALIZER])
    obj["status"] = {"phase": "Active"}


def name_required(resource: ResourceKind, detail: str) -> StoreError:
    return invalid(resource.kind, resource.group, "", [FieldError("metadata.name", "Required", detail)])
