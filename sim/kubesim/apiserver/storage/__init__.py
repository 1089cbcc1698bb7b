"""etcd and the registry: the object tables under one revision counter, the write rules of each kind (create,
update, patch, server-side apply, status, delete, finalizers), watch history and paged LIST snapshots."""
