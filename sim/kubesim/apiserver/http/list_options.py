"""ListOptions of LIST and WATCH requests: the query string parsed and validated as the apiserver does (400
for what does not parse, 422 Invalid for forbidden combinations; docs/design/k8s-protocol.md §1-§2).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from kubesim.apiserver.http.selectors import selector_predicate
from kubesim.apiserver.status import FieldError, StoreError, bad_request, invalid
from kubesim.apiserver.storage.table import Predicate


def parse_bool(value: str | None) -> bool:
    """Query booleans as the apiserver converts them: absent, "0" and "false" are false, all else true."""
    return value is not None and value.lower() not in ("0", "false")


@dataclass(frozen=True, slots=True)
class ListOptions:
    watch: bool
    resource_version: str
    rv_match: str
    continue_token: str
    limit: int
    send_initial_events: bool | None
    allow_bookmarks: bool
    timeout_seconds: int | None
    predicate: Predicate | None

    @property
    def filtered(self) -> bool:
        """A selector may leave items out (the apiserver then omits remainingItemCount)."""
        return self.predicate is not None


def parse_list_options(query: Mapping[str, str]) -> ListOptions:
    """ListOptions from the query string, validated like the apiserver (400 parse errors, 422 invalid)."""
    watch = parse_bool(query.get("watch"))
    rv = query.get("resourceVersion", "")
    match = query.get("resourceVersionMatch", "")
    cont = query.get("continue", "")
    sie_raw = query.get("sendInitialEvents")
    sie = None if sie_raw is None else parse_bool(sie_raw)
    try:
        limit = int(query.get("limit") or 0)
        timeout_raw = query.get("timeoutSeconds")
        timeout = int(timeout_raw) if timeout_raw else None
    except ValueError as exc:
        raise bad_request(str(exc)) from None
    errors: list[FieldError] = []
    if match:
        if watch and sie is None:
            errors.append(
                FieldError(
                    "resourceVersionMatch",
                    "Forbidden",
                    "resourceVersionMatch is forbidden for watch unless sendInitialEvents is provided",
                )
            )
        if not watch and not rv:
            errors.append(
                FieldError(
                    "resourceVersionMatch",
                    "Forbidden",
                    "resourceVersionMatch is forbidden unless resourceVersion is provided",
                )
            )
        if cont:
            errors.append(
                FieldError(
                    "resourceVersionMatch",
                    "Forbidden",
                    "resourceVersionMatch is forbidden when continue is provided",
                )
            )
        if match == "Exact":
            if rv == "0":
                errors.append(
                    FieldError(
                        "resourceVersionMatch",
                        "Forbidden",
                        'resourceVersionMatch "exact" is forbidden for resourceVersion "0"',
                    )
                )
        elif match != "NotOlderThan":
            errors.append(
                FieldError(
                    "resourceVersionMatch",
                    "NotSupported",
                    'supported values: "Exact", "NotOlderThan", ""',
                    f'"{match}"',
                )
            )
    if sie is not None:
        if not watch:
            errors.append(
                FieldError("sendInitialEvents", "Forbidden", "sendInitialEvents is forbidden for list")
            )
        elif match != "NotOlderThan":
            errors.append(
                FieldError(
                    "resourceVersionMatch",
                    "Forbidden",
                    "sendInitialEvents requires setting resourceVersionMatch to NotOlderThan",
                )
            )
    if errors:
        raise invalid("ListOptions", "meta.k8s.io", "", errors)
    if cont and rv not in ("", "0"):
        raise bad_request("specifying resource version is not allowed when using continue")
    if rv and rv != "0" and not rv.isdigit():
        raise StoreError.make(
            500, "InternalError", f'Internal error occurred: invalid resource version "{rv}"'
        )
    predicate = selector_predicate(query.get("labelSelector", ""), query.get("fieldSelector", ""))
    return ListOptions(
        watch=watch,
        resource_version=rv,
        rv_match=match,
        continue_token=cont,
        limit=max(limit, 0),
        send_initial_events=sie,
        allow_bookmarks=parse_bool(query.get("allowWatchBookmarks")),
        timeout_seconds=timeout,
        predicate=predicate,
    )
