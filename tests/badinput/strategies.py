"""Hypothesis strategies for adversarial Trainer objects, and the label-bound checks shared by the tests.

The objects look like what a hostile or broken cluster could send: every field may be missing, null,
of the wrong JSON type (numbers as strings, lists as dicts), huge (100 KB strings), deeply nested or
oddly valued (quantities "1e3", "500m", "-1", 1e308; dates in the future, unparsable, odd offsets;
unknown or duplicate conditions; runtimeRefs to foreign groups and kinds).
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

import msgspec
import orjson
from hypothesis import strategies as st

from app.trainer import rules
from app.trainer.events import GaugeKey
from app.trainer.projection_types import RuntimeProjection, TrainJobProjection
from app.trainer.quantity import NOT_A_COUNT
from tests.support.sinks import RecordingSink

HUGE = 100_000  # characters of a "huge" string

# --- primitives ----------------------------------------------------------------------------------

_huge_text = st.sampled_from(["a", "gpu", "-", "é", "/", "\n", "0"]).map(lambda c: c * (HUGE // len(c)))

small_text = st.text(max_size=12)
junk_scalar = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**63), max_value=2**64 - 1),
    st.integers(),  # beyond 64 bits: orjson cannot encode these, see encode()
    st.floats(allow_nan=False, allow_infinity=False),
    small_text,
)
junk = st.recursive(
    junk_scalar,
    lambda children: st.one_of(
        st.lists(children, max_size=3), st.dictionaries(small_text, children, max_size=3)
    ),
    max_leaves=8,
)


def deep(depth: int, leaf: Any = 1) -> Any:
    """A value nested ``depth`` levels deep (alternating lists and maps)."""
    value: Any = leaf
    for i in range(depth):
        value = [value] if i % 2 else {"x": value}
    return value


deep_value = st.integers(min_value=10, max_value=200).map(deep)


def maybe(strategy: st.SearchStrategy[Any], *, huge: bool = True, rate: int = 8) -> st.SearchStrategy[Any]:
    """Usually the value; about one time in ``rate`` junk of any JSON type, a deeply nested value or a
    huge string (so that most objects have a few broken fields, not all of them)."""
    bad = [junk, deep_value, st.just(MISSING), _huge_text] if huge else [junk, deep_value, st.just(MISSING)]
    broken = st.one_of(*bad)
    # Index 1, not 0: Hypothesis draws boundary values (0, rate-1) more often than the rest.
    return st.integers(0, rate - 1).flatmap(lambda i: broken if i == 1 else strategy)


MISSING: Any = object()  # drawn for a field: leave it out


def _drop_missing(d: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in d.items() if v is not MISSING}


def scrub(value: Any) -> Any:
    """Remove MISSING wherever ``maybe`` drew it (out of an object it just means "no such item")."""
    if value is MISSING:
        return None
    if isinstance(value, dict):
        return {k: scrub(v) for k, v in value.items() if v is not MISSING}
    if isinstance(value, list):
        return [scrub(v) for v in value if v is not MISSING]
    return value


def obj(**fields: st.SearchStrategy[Any]) -> st.SearchStrategy[dict[str, Any]]:
    """A JSON object in which every listed field may be missing."""
    return st.fixed_dictionaries({}, optional=fields).map(_drop_missing)


def req(**fields: st.SearchStrategy[Any]) -> st.SearchStrategy[dict[str, Any]]:
    """A JSON object whose fields are present unless ``maybe`` drew MISSING for them."""
    return st.fixed_dictionaries(fields).map(_drop_missing)


dns_name = st.from_regex(r"\A[a-z0-9]([-a-z0-9]{0,14}[a-z0-9])?(\.[a-z0-9]{1,5})?\Z")
names = st.one_of(
    dns_name,
    st.sampled_from(
        ["torch-distributed", "deepspeed-distributed", "UPPER", "a/b", "a b", "", "-x", "x" * 254]
    ),
    small_text,
)
namespaces = st.one_of(st.sampled_from(["team-a", "team-b", "default", "", "a/b", "x" * 64]), dns_name)
uids = st.one_of(st.sampled_from(["u1", "u2", "u3"]), st.uuids().map(str), st.just(""))

# RFC 3339-ish timestamps: valid, far future/past, odd offsets, unparsable
timestamps = st.one_of(
    st.sampled_from(
        [
            "2025-06-01T10:00:00Z",
            "2025-06-01T10:30:00Z",
            "2025-06-01T10:30:00.123456789Z",
            "9999-12-31T23:59:59Z",
            "9999-12-31T23:59:59-23:59",
            "0001-01-01T00:00:00+23:59",
            "0001-01-01T00:00:00Z",
            "2025-06-01T10:00:00+14:00",
            "2025-06-01T10:00:00-12:00",
            "2025-06-01T10:00:00+05:45",
            "2025-06-01T10:00:00+00:00:30",
            "2025-06-01",
            "2025-13-45T99:99:99Z",
            "yesterday",
            "",
            "1e308",
            "NaN",
        ]
    ),
    st.datetimes().map(lambda d: d.isoformat() + "Z"),
)

# numNodes and quantities
odd_numbers = st.one_of(
    st.integers(min_value=-5, max_value=5),
    st.integers(min_value=0, max_value=64),
    st.sampled_from([2**31 - 1, 2**31, 2**63 - 1, -(2**63), 2**64 - 1, 2**80]),
    st.sampled_from([1.5, 2.0, -1.0, 1e308, -1e308, 0.0, -0.0, 5e-324]),
    st.sampled_from(
        [
            "1.5",
            "1e3",
            "500m",
            "-1",
            "abc",
            "NaN",
            "nan",
            "Infinity",
            "-Infinity",
            "inf",
            "2",
            "07",
            "1Ki",
            "1E",
            "1e400",
            "1e-400",
            "+3",
            ".5",
            "5.",
            "",
            " 4 ",
            "٣",
            "1_000",
            "0x10",
            "9" * 13,
            "9" * 70,
        ]
    ),
    st.booleans(),
    st.none(),
)
quantities = odd_numbers
resource_names = st.one_of(
    st.sampled_from(
        [
            "nvidia.com/gpu",
            "amd.com/gpu",
            "google.com/tpu",
            "cpu",
            "memory",
            "GPU",
            "example.com/GPU-x",
            "gpu\n{}",
            'gpu"} 1\n',
            "gpu" * 100,
            "\uff27\uff30\uff35",  # fullwidth GPU: lower() is not "gpu"
        ]
    ),
    small_text.map(lambda s: s + "gpu"),
    _huge_text.map(lambda s: "gpu" + s),
)
resource_list = maybe(st.dictionaries(resource_names, quantities, max_size=4))
resources = maybe(obj(requests=resource_list, limits=resource_list))

condition_types = st.sampled_from(
    ["Complete", "Failed", "Suspended", "Created", "Running", "Unknown", "complete", ""]
)
condition_status = st.sampled_from(["True", "False", "Unknown", "true", "", "TRUE"])
reasons = st.one_of(
    st.sampled_from(
        [*rules.FAILURE_REASONS, "AllJobsCompleted", "Suspended", "Resumed", "JobsCreationFailed"]
    ),
    small_text,
    _huge_text,
)
condition = obj(
    type=maybe(condition_types),
    status=maybe(condition_status),
    reason=maybe(reasons),
    message=maybe(small_text),
    lastTransitionTime=maybe(timestamps),
)
conditions = maybe(
    st.one_of(
        st.lists(maybe(condition, huge=False), max_size=6),
        # duplicates: the same condition several times, with different statuses
        st.tuples(condition, st.integers(1, 4)).map(lambda t: [t[0]] * t[1]),
    )
)
jobs_status = maybe(st.lists(maybe(obj(name=maybe(small_text), active=maybe(odd_numbers))), max_size=4))

runtime_ref = maybe(
    obj(
        name=maybe(names),
        apiGroup=maybe(
            st.sampled_from(
                ["trainer.kubeflow.org", "", "kubeflow.org", "evil.example.com", "TRAINER.KUBEFLOW.ORG"]
            )
        ),
        kind=maybe(
            st.sampled_from(
                ["TrainingRuntime", "ClusterTrainingRuntime", "", "Pod", "trainingruntime", "JobSet"]
            )
        ),
    )
)


@st.composite
def trainjobs(draw: st.DrawFn) -> Any:
    metadata = draw(
        maybe(
            st.tuples(
                req(
                    name=maybe(names),
                    namespace=maybe(namespaces),
                    uid=maybe(uids),
                    resourceVersion=maybe(st.one_of(st.integers(0, 10**6).map(str), st.just("abc"))),
                    creationTimestamp=maybe(timestamps),
                ),
                obj(
                    labels=maybe(st.dictionaries(small_text, small_text, max_size=2)),
                    annotations=maybe(st.dictionaries(small_text, _huge_text, max_size=1)),
                    managedFields=junk,
                ),
            ).map(lambda t: {**t[0], **t[1]}),
            rate=20,
        )
    )
    spec = draw(
        maybe(
            obj(
                runtimeRef=runtime_ref,
                trainer=maybe(obj(numNodes=maybe(odd_numbers), resourcesPerNode=resources, image=junk)),
                suspend=maybe(st.booleans()),
            )
        )
    )
    status = draw(maybe(obj(conditions=conditions, jobsStatus=jobs_status)))
    doc = draw(obj(spec=st.just(spec), status=st.just(status), extra=deep_value))
    if metadata is not MISSING:
        doc["metadata"] = metadata
    return scrub(draw(maybe(st.just(doc), rate=20)))


def valid_metadata(obj_: Any, name: str, uid: str, namespace: str | None = "team-a") -> Any:
    """``obj_`` with a usable name/uid (so it is projected at all) but everything else left as drawn."""
    if not isinstance(obj_, dict):
        obj_ = {"spec": obj_}
    meta = obj_.get("metadata")
    meta = dict(meta) if isinstance(meta, dict) else {}
    meta["name"], meta["uid"] = name, uid
    if namespace is not None:
        meta["namespace"] = namespace
    return {**obj_, "metadata": meta}


container = obj(name=maybe(st.sampled_from(["node", "launcher", "x"])), resources=resources)
replicated_job = obj(
    name=maybe(st.sampled_from(["node", "launcher", "dataset-initializer", "trainer"])),
    template=maybe(
        obj(
            metadata=maybe(
                obj(
                    labels=maybe(
                        st.dictionaries(st.just(rules.ANCESTOR_LABEL), st.sampled_from(["trainer", "x"]))
                    )
                )
            ),
            spec=maybe(
                obj(template=maybe(obj(spec=maybe(obj(containers=maybe(st.lists(container, max_size=3)))))))
            ),
        )
    ),
)
policy_value: st.SearchStrategy[Any] = st.one_of(st.just({}), st.none(), junk)


@st.composite
def runtimes(draw: st.DrawFn) -> Any:
    framework = maybe(st.sampled_from(["torch", "deepspeed", "", "x" * 64]))
    metadata = draw(
        maybe(
            req(
                name=maybe(names),
                namespace=maybe(namespaces),
                uid=maybe(uids),
                resourceVersion=maybe(st.integers(0, 10**6).map(str)),
                labels=maybe(
                    st.fixed_dictionaries({}, optional={rules.FRAMEWORK_LABEL: framework, "x": junk})
                ),
            ),
            rate=20,
        )
    )
    ml = maybe(
        obj(
            numNodes=maybe(odd_numbers),
            torch=policy_value,
            mpi=maybe(obj(runLauncherAsNode=maybe(st.booleans()), numProcPerNode=junk)),
            flux=policy_value,
            jax=policy_value,
            xgboost=policy_value,
            unknownPolicy=policy_value,
        )
    )
    pgp = maybe(obj(coscheduling=policy_value, volcano=policy_value, other=policy_value))
    template = maybe(obj(spec=maybe(obj(replicatedJobs=maybe(st.lists(replicated_job, max_size=3))))))
    spec = draw(maybe(obj(mlPolicy=ml, podGroupPolicy=pgp, template=template)))
    doc = draw(obj(spec=st.just(spec)))
    if metadata is not MISSING:
        doc["metadata"] = metadata
    return scrub(draw(maybe(st.just(doc), rate=20)))


# --- encoding ------------------------------------------------------------------------------------


def encode(value: Any) -> bytes:
    """JSON bytes as an API server could send them (orjson; stdlib json for ints beyond 64 bits)."""
    try:
        return orjson.dumps(value)
    except (TypeError, orjson.JSONEncodeError):
        return json.dumps(value).encode()


def typed(projector: Any, value: Any) -> Any:
    """The informer's fast path: msgspec straight into the wire type, then ``from_wire``.

    Returns ``None`` when the typed decoder rejects the object (ValidationError: the fallback trigger).
    ``from_wire`` itself must not raise.
    """
    try:
        wire = msgspec.json.decode(encode(value), type=projector.wire_type)
    except msgspec.ValidationError:
        return None
    return projector.from_wire(wire)


def informer_projection(projector: Any, value: Any) -> Any:
    """What the informer caches for ``value``: typed when that works and gives a key, else tolerant."""
    obj_ = typed(projector, value)
    if obj_ is not None and obj_.key:
        return obj_
    return projector.from_json(value)


# --- label bounds --------------------------------------------------------------------------------

_DNS_LABEL = r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?"
_DNS_SUBDOMAIN = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*"
DNS_SUBDOMAIN_RE = re.compile(rf"^{_DNS_SUBDOMAIN}$")
RUNTIME_REF_RE = re.compile(
    rf"\Atrainer\.kubeflow\.org/(TrainingRuntime/{_DNS_LABEL}|ClusterTrainingRuntime/)/{_DNS_SUBDOMAIN}\Z"
)
MAX_RUNTIME_REF = len("trainer.kubeflow.org/ClusterTrainingRuntime//") + 63 + 253
# A resource name as Kubernetes accepts it: [prefix/]name, prefix a DNS subdomain, name a qualified name.
RESOURCE_NAME_RE = re.compile(
    r"\A([a-z0-9]([-a-z0-9.]*[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?\Z"
)
MAX_RESOURCE_NAME = 253 + 1 + 63


def runtime_ref_ok(ref: str) -> bool:
    """The documented runtime_ref bound: "unknown", or group/kind/ns/name with a DNS name, bounded length."""
    if ref == rules.UNKNOWN:
        return True
    return len(ref) <= MAX_RUNTIME_REF and RUNTIME_REF_RE.match(ref) is not None


def runtime_ref_lenient_ok(ref: str) -> bool:
    """What rules.runtime_ref_label enforces today: Trainer group/kind, a DNS name (not the namespace)."""
    if ref == rules.UNKNOWN:
        return True
    group, _, rest = ref.partition("/")
    kind, _, rest = rest.partition("/")
    name = rest.rpartition("/")[2]
    return (
        group == "trainer.kubeflow.org"
        and kind in rules.RUNTIME_KINDS
        and 0 < len(name) <= 253
        and re.fullmatch(_DNS_SUBDOMAIN, name) is not None
    )


def accelerator_class_length_ok(cls: str) -> bool:
    # "other": classes beyond the state's cap
    return cls in (rules.NONE, "other") or (0 < len(cls) <= 253 and rules.is_resource_name(cls))


def resources_ok(resources: rules.NodeResources) -> bool:
    """A projection's resource lists: bounded, valid names, counts >= 0 or NOT_A_COUNT (a size or a share
    such as "8G" is kept so that it still overrides the runtime's value: app/trainer/rules/nodes.py)."""
    return all(
        len(entries) <= rules.MAX_RESOURCE_ENTRIES
        and all(
            rules.is_resource_name(name) and isinstance(n, int) and (n >= 0 or n == NOT_A_COUNT)
            for name, n in entries
        )
        for entries in resources
    )


def accelerator_class_charset_ok(cls: str) -> bool:
    return cls == rules.NONE or (len(cls) <= MAX_RESOURCE_NAME and RESOURCE_NAME_RE.match(cls) is not None)


def finite_nonneg(x: float | int | None) -> bool:
    return x is None or (math.isfinite(x) and x >= 0)


def check_job_projection(p: TrainJobProjection) -> None:
    assert isinstance(p, TrainJobProjection)
    assert p.key and p.uid
    assert p.state in rules.JOB_STATES, p.state
    assert p.result in ("", *rules.RESULTS), p.result
    assert len(p.reason) <= 64
    assert rules.is_reason_label(rules.reason_bucket(p.result, p.reason))
    assert runtime_ref_lenient_ok(p.runtime_ref), p.runtime_ref[:200]
    assert p.num_nodes is None or 0 <= p.num_nodes <= rules.MAX_NUM_NODES
    assert p.resources is None or resources_ok(p.resources)
    assert p.created is None or math.isfinite(p.created)
    assert p.terminal_time is None or math.isfinite(p.terminal_time)
    assert (p.terminal_time is None) or p.terminal


def check_runtime_projection(r: RuntimeProjection) -> None:
    assert isinstance(r, RuntimeProjection)
    assert r.kind in rules.RUNTIME_KINDS
    assert r.ml_policy in rules.ML_POLICIES, r.ml_policy
    assert r.pod_group_policy in rules.POD_GROUP_POLICIES, r.pod_group_policy
    assert 0 < len(r.framework) <= rules.MAX_LABEL_VALUE
    assert runtime_ref_lenient_ok(r.ref), r.ref[:200]
    assert r.num_nodes is None or 0 <= r.num_nodes <= rules.MAX_NUM_NODES
    assert resources_ok(r.node_resources)
    assert 0 <= r.default_nodes <= rules.MAX_NUM_NODES


def check_gauge_key(key: GaugeKey) -> None:
    """A gauge key's labels are bounded: a known state, a runtime_ref of bounded length."""
    _, ref, state = key
    assert state in rules.JOB_STATES, state
    assert runtime_ref_lenient_ok(ref), ref[:200]


def recording_sink() -> RecordingSink:
    """A RecordingSink (tests/support/sinks.py) that checks every gauge key it is handed."""
    return RecordingSink(check_gauge_key)
