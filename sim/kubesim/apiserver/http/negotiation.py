"""Content negotiation of the simulated apiserver: which representation a request's ``Accept`` asks for
(JSON, YAML, ``Table``, ``PartialObjectMetadata(List)``, aggregated discovery), 406 NotAcceptable when
none can be served, and the request body formats (JSON, YAML; 415 for anything else).

Like the apiserver, the first acceptable media range in the header wins; ``*/*``, ``application/*`` and a
missing header mean JSON. Protobuf is never served (custom resources have none; for the built-in kinds a
real server would answer protobuf-only clients, which the simulator does not support).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final, Literal

from kubesim.apiserver.status import StoreError

Form = Literal["json", "yaml", "table", "partial", "partial-list", "aggregated"]
SERVED: Final = "application/json, application/yaml"
_META_VERSIONS: Final = ("v1", "v1beta1")


@dataclass(frozen=True, slots=True)
class Representation:
    form: Form
    version: str = "v1"  # meta.k8s.io (Table, PartialObjectMetadata) or apidiscovery.k8s.io version

    @property
    def api_version(self) -> str:
        return f"meta.k8s.io/{self.version}"


JSON: Final = Representation("json")


def _ranges(header: str) -> list[tuple[str, dict[str, str]]]:
    out: list[tuple[str, dict[str, str]]] = []
    for part in header.split(","):
        pieces = [p.strip() for p in part.split(";")]
        if not pieces[0]:
            continue
        params = {}
        for p in pieces[1:]:
            key, _, value = p.partition("=")
            params[key.strip().lower()] = value.strip().strip('"')
        if params.get("q") == "0":
            continue
        out.append((pieces[0].lower(), params))
    return out


def not_acceptable(served: str = SERVED) -> StoreError:
    return StoreError.make(406, "NotAcceptable", f"only the following media types are accepted: {served}")


def negotiate(
    header: str | None, *, target: Literal["object", "list", "watch", "discovery"]
) -> Representation:
    """The representation to answer with; 406 when the client accepts none the server can produce."""
    if not header or not header.strip():
        return JSON
    for media, params in _ranges(header):
        kind = params.get("as")
        if media in ("*/*", "application/*", "application/json", "application/json;stream=watch"):
            if kind is None:
                return JSON
            group, version = params.get("g", ""), params.get("v", "")
            if target == "discovery":
                if (
                    kind == "APIGroupDiscoveryList"
                    and group == "apidiscovery.k8s.io"
                    and version in ("v2", "v2beta1")
                ):
                    return Representation("aggregated", version)
                continue
            if group != "meta.k8s.io" or version not in _META_VERSIONS:
                continue
            if kind == "Table":
                return Representation("table", version)
            if kind == "PartialObjectMetadata" and target in ("object", "watch"):
                return Representation("partial", version)
            if kind == "PartialObjectMetadataList" and target == "list":
                return Representation("partial-list", version)
        elif media in ("application/yaml", "text/yaml") and kind is None and target in ("object", "list"):
            return Representation("yaml")
    raise not_acceptable()


def body_format(content_type: str, *, typed: bool) -> Literal["json", "yaml", "protobuf"]:
    """How a POST/PUT body is encoded; 415 for what the apiserver does not decode (protobuf for CRs...)."""
    media = content_type.split(";", maxsplit=1)[0].strip().lower()
    if media in ("", "application/json", "application/octet-stream"):
        return "json"
    if media in ("application/yaml", "text/yaml"):
        return "yaml"
    if media == "application/vnd.kubernetes.protobuf" and typed:
        return "protobuf"
    raise StoreError.make(
        415,
        "UnsupportedMediaType",
        f"the body of the request was in an unknown format - accepted media types include: {SERVED}",
    )
