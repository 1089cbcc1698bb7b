"""The update paths of the registry: PUT (with create-on-update of Leases, docs/design/k8s-protocol.md
§4), PATCH and server-side apply, with optimistic concurrency, the status subresource, generation bumps,
no-op detection and managedFields, and the removal of an object whose last finalizer goes, before the one
commit in :mod:`kubesim.apiserver.storage.store_core`.
"""

from __future__ import annotations

from typing import Any

import orjson

from kubesim.apiserver.core import LEASES, PODS
from kubesim.apiserver.resources import ResourceKind
from kubesim.apiserver.schema.validation import WriteOptions, serializable
from kubesim.apiserver.status import (
    FieldError,
    bad_request,
    conflict,
    invalid,
    not_found,
    precondition_failed,
    resource_not_found,
)
from kubesim.apiserver.storage.apply import apply_config
from kubesim.apiserver.storage.managed_fields import record_update
from kubesim.apiserver.storage.patch import MERGING, apply_patch
from kubesim.apiserver.storage.pods import bound, check_spec_update
from kubesim.apiserver.storage.store_core import TRUSTED, Objs
from kubesim.apiserver.storage.store_create import StoreCreates, bounded, name_required
from kubesim.apiserver.storage.strategy import (
    FROM_BODY,
    assemble,
    check_namespace,
    now_rfc3339,
    own,
    same_content,
    spec_changed,
    update_metadata,
)
from kubesim.apiserver.storage.table import Entry, Obj

_ABSENT = object()  # a missing status differs from a null one


class StoreUpdates(StoreCreates):
    """Updates, patches and server-side apply (see :class:`kubesim.apiserver.storage.store.Store`)."""

    def update(
        self,
        resource: ResourceKind,
        namespace: str | None,
        obj: Obj,
        *,
        subresource: str | None = None,
        field_manager: str = "sim",
        opts: WriteOptions | None = None,
    ) -> Obj:
        resource = self.served(resource)
        entry, _ = self._update(resource, namespace, own(obj), subresource, field_manager, opts or TRUSTED)
        return entry.copy()

    def bind_pod(
        self, namespace: str, name: str, binding: Any, *, field_manager: str = "kube-scheduler"
    ) -> Obj:
        """POST pods/<name>/binding: the pod bound to the binding's node (storage/pods.py ``bound``)."""
        entry = self.get_entry(PODS, namespace, name)
        return self.update(PODS, namespace, bound(entry.copy(), binding), field_manager=field_manager)

    def update_or_create(
        self,
        resource: ResourceKind,
        namespace: str | None,
        obj: Obj,
        *,
        subresource: str | None = None,
        field_manager: str = "sim",
        opts: WriteOptions | None = None,
    ) -> tuple[Obj, bool]:
        """PUT as the HTTP layer needs it: also says whether a Lease was created (201)."""
        resource = self.served(resource)
        entry, created = self._update(
            resource, namespace, own(obj), subresource, field_manager, opts or TRUSTED
        )
        return entry.copy(), created

    def patch(
        self,
        resource: ResourceKind,
        namespace: str | None,
        name: str,
        patch: Any,
        *,
        subresource: str | None = None,
        patch_type: str = "merge",
        field_manager: str = "sim",
        copy: bool = True,
        opts: WriteOptions | None = None,
    ) -> Obj:
        """Patch; returns the result as :meth:`create` does (``copy=False``: shared and read-only)."""
        resource = self.served(resource)
        opts = opts or TRUSTED
        entry = self.get_entry(resource, namespace, name)
        # A merge patch of status needs no deep copy: merge_patch copies the maps along the patch's paths and
        # never mutates its target, and a status write keeps the rest of the stored object as it is.
        # json_patch works in place, and spec writes are defaulted in place: those work on a copy.
        shared = patch_type in MERGING and subresource == "status"
        patched = apply_patch(entry.obj if shared else entry.copy(), patch, patch_type)
        meta = patched.setdefault("metadata", {})
        if not isinstance(meta, dict):
            raise bad_request("metadata must be an object")
        meta = patched["metadata"] = dict(meta)  # may be the stored object's own
        # A resourceVersion inside the patch is a precondition; otherwise the patch applies to what we read.
        if str(meta.get("resourceVersion", "")) != str(entry.rv):
            if meta.get("resourceVersion"):
                raise conflict(resource, name)
            meta["resourceVersion"] = str(entry.rv)
        meta["name"] = name
        result, _ = self._update(resource, namespace, patched, subresource, field_manager, opts, old=entry)
        return result.copy() if copy else result.obj

    def apply(
        self,
        resource: ResourceKind,
        namespace: str | None,
        name: str,
        config: Obj,
        *,
        field_manager: str,
        subresource: str | None = None,
        opts: WriteOptions | None = None,
    ) -> tuple[Obj, bool]:
        """Server-side apply (kubesim.apiserver.storage.apply); creates the object when it does not exist.
        (object, created)"""
        resource = self.served(resource)
        opts = opts or TRUSTED
        schema, table = self._kind(resource)
        config = own(config)
        validator = schema.validator if opts.validate else None
        if validator is not None:
            validator.check_type_meta(config)
        if not config.get("kind") or not config.get("apiVersion"):
            raise bad_request(
                f"Object 'Kind' is missing in '{orjson.dumps(config).decode()}'"
                if not config.get("kind")
                else "Object 'apiVersion' is missing"
            )
        meta = config.setdefault("metadata", {})
        if not isinstance(meta, dict):
            raise bad_request("metadata must be an object")
        if meta.get("name") and meta["name"] != name:
            raise bad_request(
                f"the name of the object ({meta['name']}) does not match the name on the URL ({name})"
            )
        meta["name"] = name
        if validator is not None:
            validator.decode(config, None, opts)
        ns = check_namespace(resource, namespace, dict(meta))
        entry = table.index.get((ns or "", name))
        if entry is None:
            if subresource is not None:
                raise not_found(resource, name)
            created = self.create(
                resource, ns, config, field_manager=field_manager, opts=opts, operation="Apply"
            )
            return created, True
        if (
            meta.get("resourceVersion")
            and meta["resourceVersion"] != entry.obj["metadata"]["resourceVersion"]
        ):
            raise conflict(resource, name)
        merged, managed = apply_config(
            entry.obj,
            config,
            node=self._node(schema),
            manager=field_manager,
            api_version=resource.api_version,
            subresource=subresource,
            force=opts.force,
            when=now_rfc3339(),
        )
        merged["metadata"] = dict(
            merged["metadata"], resourceVersion=entry.obj["metadata"]["resourceVersion"]
        )
        result, _ = self._update(
            resource, ns, merged, subresource, field_manager, opts, old=entry, managed=managed
        )
        return result.copy(), False

    def _update(  # noqa: PLR0917 - the registry's update path, private
        self,
        resource: ResourceKind,
        namespace: str | None,
        body: Obj,
        subresource: str | None,
        field_manager: str,
        opts: WriteOptions,
        *,
        old: Entry | None = None,
        managed: Objs | None = None,
    ) -> tuple[Entry, bool]:
        schema, table = self._kind(resource)
        if subresource not in (None, "status") or (subresource == "status" and not schema.status_subresource):
            raise resource_not_found()
        validator = schema.validator if opts.validate else None
        if validator is not None:
            validator.check_type_meta(body)
        meta = body.get("metadata")
        if not isinstance(meta, dict):
            meta = body["metadata"] = {}
        namespace = check_namespace(resource, namespace, meta)
        name = meta.get("name") or ""
        if not name:
            raise name_required(resource, "name is required")
        entry = table.index.get((namespace or "", name))
        rv = str(meta.get("resourceVersion") or "")
        if entry is None:
            if resource == LEASES and subresource is None and not rv:
                meta.pop("resourceVersion", None)
                created = self.create(resource, namespace, body, field_manager=field_manager, opts=opts)
                if opts.dry_run:
                    return Entry((namespace or "", name), created, 0), True
                return self.get_entry(resource, namespace, created["metadata"]["name"]), True
            raise not_found(resource, name)
        if not rv:
            raise invalid(
                resource.kind,
                resource.group,
                name,
                [FieldError("metadata.resourceVersion", "Invalid", "must be specified for an update", "0x0")],
            )
        stored_meta = entry.obj["metadata"]
        if rv != stored_meta["resourceVersion"]:
            raise conflict(resource, name)
        if meta.get("uid") and meta["uid"] != stored_meta["uid"]:
            raise precondition_failed(resource, name, "UID", meta["uid"], stored_meta["uid"])
        if subresource == "status":
            new_obj = dict(entry.obj)
            if "status" in body:
                new_obj["status"] = body["status"]
            else:
                new_obj.pop("status", None)
            if validator is not None:
                validator.decode(new_obj, entry.obj, opts)
        else:
            if validator is not None:
                validator.decode(body, entry.obj if old is not None else None, opts)
            # Writes to the main resource keep the stored status when it has its own subresource.
            keep_status = entry.obj.get("status") if schema.status_subresource else FROM_BODY
            new_obj = assemble(
                schema,
                body,
                update_metadata(stored_meta, meta),
                status=keep_status,
                defaults=validator is None,
            )
            if validator is not None and resource == PODS:
                check_spec_update(entry.obj, new_obj)
        if validator is not None:
            validator.validate(new_obj, entry.obj)
        if subresource == "status":
            # Only the status was replaced (same metadata object, same spec): compare just that.
            same = new_obj.get("status", _ABSENT) == entry.obj.get("status", _ABSENT)
        else:
            same = same_content(new_obj, entry.obj)
        if same and managed is None:
            self.counters["noop_writes"] += 1
            return entry, False
        new_meta = new_obj["metadata"] = dict(new_obj["metadata"])
        if (
            schema.generation
            and subresource != "status"
            and spec_changed(new_obj, entry.obj, schema.status_subresource)
        ):
            new_meta["generation"] = int(stored_meta.get("generation", 1)) + 1
        if managed is None:
            managed = record_update(
                stored_meta.get("managedFields") or [],
                manager=field_manager,
                resource=resource,
                node=self._node(schema),
                old=entry.obj,
                new=new_obj,
                subresource=subresource,
                status_subresource=schema.status_subresource,
                when=now_rfc3339(),
            )
        new_meta["managedFields"] = managed
        if same and managed == stored_meta.get("managedFields"):
            self.counters["noop_writes"] += 1
            return entry, False
        if opts.dry_run:
            serializable(new_obj, resource.kind)
            return Entry(entry.key, new_obj, entry.rv), False
        if new_meta.get("deletionTimestamp") and not new_meta.get("finalizers"):
            # Removing the last finalizer of an object being deleted deletes it.
            return self._remove(resource, Entry(entry.key, new_obj, entry.rv)), False
        return self._commit(resource, "MODIFIED", new_obj, entry, checked=bounded(validator)), False
