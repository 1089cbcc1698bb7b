"""metav1.Status bodies and the API errors of the simulated apiserver (docs/design/k8s-protocol.md §3).

Clients branch on ``reason``, ``code`` and ``details`` and tests compare whole bodies, so the shapes, key
order and messages follow the apiserver's exactly.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from kubesim.apiserver.resources import ResourceKind

NOT_FOUND_MESSAGE = "the server could not find the requested resource"


def status_body(
    code: int,
    reason: str,
    message: str,
    details: dict[str, Any] | None = None,
    *,
    metadata: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """A metav1.Status in the exact key order and shape the apiserver writes."""
    body: dict[str, Any] = {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": metadata or {},
        "status": "Failure",
        "message": message,
        "reason": reason,
    }
    if details is not None:
        body["details"] = details
    body["code"] = code
    return body


class StoreError(Exception):
    """A Kubernetes API error: ``code`` (HTTP status) and ``status`` (the exact Status JSON body)."""

    def __init__(self, code: int, status: dict[str, Any], headers: dict[str, str] | None = None) -> None:
        super().__init__(status.get("message", ""))
        self.code = code
        self.status = status
        self.headers = headers or {}

    @classmethod
    def make(cls, code: int, reason: str, message: str, details: dict[str, Any] | None = None) -> StoreError:
        return cls(code, status_body(code, reason, message, details))


def qualified(resource: ResourceKind) -> str:
    return f"{resource.plural}.{resource.group}" if resource.group else resource.plural


def resource_not_found() -> StoreError:
    """An unknown path or kind (a CRD not installed): empty details, unlike an object's NotFound."""
    return StoreError.make(404, "NotFound", NOT_FOUND_MESSAGE, {})


def not_found(resource: ResourceKind, name: str) -> StoreError:
    return StoreError.make(
        404,
        "NotFound",
        f'{qualified(resource)} "{name}" not found',
        {"name": name, "group": resource.group, "kind": resource.plural},
    )


def already_exists(resource: ResourceKind, name: str) -> StoreError:
    return StoreError.make(
        409,
        "AlreadyExists",
        f'{qualified(resource)} "{name}" already exists',
        {"name": name, "group": resource.group, "kind": resource.plural},
    )


def conflict(resource: ResourceKind, name: str, why: str | None = None) -> StoreError:
    why = why or "the object has been modified; please apply your changes to the latest version and try again"
    return StoreError.make(
        409,
        "Conflict",
        f'Operation cannot be fulfilled on {qualified(resource)} "{name}": {why}',
        {"name": name, "group": resource.group, "kind": resource.plural},
    )


def precondition_failed(
    resource: ResourceKind, name: str, what: str, requested: Any, stored: Any
) -> StoreError:
    """409 for a uid or resourceVersion precondition (DeleteOptions, an update's metadata.uid) not met."""
    return conflict(
        resource,
        name,
        f"Precondition failed: {what} in precondition: {requested}, {what} in object meta: {stored}",
    )


FieldErrorType = Literal[
    "Invalid", "Required", "Forbidden", "NotSupported", "Duplicate", "TypeInvalid", "TooLong", "TooMany"
]


@dataclass(frozen=True, slots=True)
class FieldError:
    """One field.Error of apimachinery: its ``cause`` and its text inside the Status message."""

    field: str
    type: FieldErrorType
    detail: str
    value: str | None = None  # already formatted as Go's %#v would print it

    _REASONS = {
        "Invalid": ("FieldValueInvalid", "Invalid value"),
        "Required": ("FieldValueRequired", "Required value"),
        "Forbidden": ("FieldValueForbidden", "Forbidden"),
        "NotSupported": ("FieldValueNotSupported", "Unsupported value"),
        "Duplicate": ("FieldValueDuplicate", "Duplicate value"),
        "TypeInvalid": ("FieldValueTypeInvalid", "Invalid value"),
        "TooLong": ("FieldValueTooLong", "Too long"),
        "TooMany": ("FieldValueTooMany", "Too many"),
    }

    def message(self) -> str:
        # field.Error.ErrorBody: Required, Forbidden and TooLong never show the value; the detail follows.
        label = self._REASONS[self.type][1]
        text = label
        if self.value is not None and self.type not in ("Required", "Forbidden", "TooLong"):
            text = f"{label}: {self.value}"
        return f"{text}: {self.detail}" if self.detail else text

    def cause(self) -> dict[str, str]:
        return {"reason": self._REASONS[self.type][0], "message": self.message(), "field": self.field}


def invalid(kind: str, group: str, name: str, errors: list[FieldError]) -> StoreError:
    """422 Invalid; like apimachinery's NewInvalid: one error inline, several in [..]."""
    parts = [f"{e.field}: {e.message()}" for e in errors]
    joined = parts[0] if len(parts) == 1 else "[" + ", ".join(parts) + "]"
    qualified_kind = f"{kind}.{group}" if group else kind
    details: dict[str, Any] = {
        "name": name,
        "group": group,
        "kind": kind,
        "causes": [e.cause() for e in errors],
    }
    if not name:
        del details["name"]
    return StoreError.make(422, "Invalid", f'{qualified_kind} "{name}" is invalid: {joined}', details)


def bad_request(message: str) -> StoreError:
    return StoreError.make(400, "BadRequest", message)


def expired(message: str, continue_token: str | None = None) -> StoreError:
    meta = {"continue": continue_token} if continue_token else None
    return StoreError(410, status_body(410, "Expired", message, metadata=meta))


def too_large_rv(requested: int, current: int) -> StoreError:
    err = StoreError.make(
        504,
        "Timeout",
        f"Timeout: Too large resource version: {requested}, current: {current}",
        {
            "causes": [{"reason": "ResourceVersionTooLarge", "message": "Too large resource version"}],
            "retryAfterSeconds": 1,
        },
    )
    err.headers["Retry-After"] = "1"
    return err
