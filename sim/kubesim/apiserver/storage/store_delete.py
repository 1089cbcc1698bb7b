"""The delete paths of the registry: preconditions, finalizers (a deletionTimestamp instead of a
removal), collection deletes, and namespace termination (its content deleted first, the namespace removed
once empty), each change committed through :mod:`kubesim.apiserver.storage.store_core`.
"""

from __future__ import annotations

from typing import Any

from kubesim.apiserver.core import NAMESPACES
from kubesim.apiserver.resources import ResourceKind
from kubesim.apiserver.schema.validation import WriteOptions
from kubesim.apiserver.status import precondition_failed
from kubesim.apiserver.storage.store_core import TRUSTED, Objs, StoreCore
from kubesim.apiserver.storage.strategy import now_rfc3339
from kubesim.apiserver.storage.table import Entry, Obj, Predicate


class StoreDeletes(StoreCore):
    """Deletes and namespace termination (see :class:`kubesim.apiserver.storage.store.Store`)."""

    def delete(
        self,
        resource: ResourceKind,
        namespace: str | None,
        name: str,
        *,
        preconditions: dict[str, Any] | None = None,
        copy: bool = True,
        opts: WriteOptions | None = None,
    ) -> Obj:
        """With finalizers: set deletionTimestamp (MODIFIED), else remove (DELETED). Returns last state
        (``copy=False``: shared and read-only). Deleting a namespace deletes what is in it first."""
        resource = self.served(resource)
        opts = opts or TRUSTED
        entry = self.get_entry(resource, namespace, name)
        meta = entry.obj["metadata"]
        if preconditions:
            uid, rv = preconditions.get("uid"), preconditions.get("resourceVersion")
            if uid and uid != meta.get("uid"):
                raise precondition_failed(resource, name, "UID", uid, meta["uid"])
            if rv and str(rv) != meta.get("resourceVersion"):
                raise precondition_failed(resource, name, "ResourceVersion", rv, meta["resourceVersion"])
        if resource == NAMESPACES:
            return self._delete_namespace(entry, opts, copy)
        if meta.get("finalizers"):
            if meta.get("deletionTimestamp"):
                return entry.copy() if copy else entry.obj
            new_obj = dict(entry.obj)
            new_meta = dict(meta)
            new_meta["deletionTimestamp"] = now_rfc3339()
            if self._kind(resource)[0].generation:
                new_meta["deletionGracePeriodSeconds"] = 0
            new_obj["metadata"] = new_meta
            if opts.dry_run:
                return new_obj
            done = self._commit(resource, "MODIFIED", new_obj, entry)
        else:
            if opts.dry_run:
                return entry.copy()
            done = self._remove(resource, entry)
        return done.copy() if copy else done.obj

    def delete_collection(
        self,
        resource: ResourceKind,
        namespace: str | None,
        *,
        predicate: Predicate | None = None,
        opts: WriteOptions | None = None,
    ) -> Objs:
        """DELETE on a collection: every (matching) object, each deleted as by :meth:`delete`."""
        resource = self.served(resource)
        out = []
        for entry in self.entries(resource, namespace):
            if predicate is None or predicate(entry):
                out.append(self.delete(resource, entry.key[0] or None, entry.key[1], opts=opts))
        return out

    def _delete_namespace(self, entry: Entry, opts: WriteOptions, copy: bool) -> Obj:
        """The namespace goes Terminating, its content is deleted (the namespace controller's work, done at
        once); it is removed when nothing is left in it (objects held by finalizers keep it)."""
        name = entry.key[1]
        if opts.dry_run:
            return entry.copy()
        current = entry
        if not entry.obj["metadata"].get("deletionTimestamp"):
            obj = dict(entry.obj)
            obj["metadata"] = dict(obj["metadata"], deletionTimestamp=now_rfc3339())
            obj["status"] = dict(obj.get("status") or {}, phase="Terminating")
            current = self._commit(NAMESPACES, "MODIFIED", obj, entry)
        for res in self._schemas:
            if res.namespaced:
                for e in self.entries(res, name):
                    if not e.obj["metadata"].get("deletionTimestamp"):
                        self.delete(res, name, e.key[1])
        return (self._finish_namespace(name) or current).copy() if copy else current.obj
