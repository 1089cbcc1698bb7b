"""The simulator's CEL compiler (sim/kubesim/apiserver/schema/cel.py) against a maintained CEL implementation
(cel-rust, through the common-expression-language binding): every ``x-kubernetes-validations`` rule of the
vendored CRDs, on
inputs that pass, fail and error, must give the same result in both."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import cel as reference
import pytest

from kubesim.apiserver import crds
from kubesim.apiserver.schema import cel
from kubesim.trainer import manifests

# Inputs per rule: the values of ``self`` (and ``oldSelf``) the rules meet, good and bad.
SAMPLES: dict[str, list[dict[str, Any]]] = {
    "self == oldSelf": [
        {"self": {"a": 1}, "oldSelf": {"a": 1}},
        {"self": {"a": 1}, "oldSelf": {"a": 2}},
        {"self": "x", "oldSelf": "x"},
        {"self": [1, 2], "oldSelf": [2, 1]},
        {"self": 1, "oldSelf": 1},
    ],
    "self >= 1": [{"self": 0}, {"self": 1}, {"self": 7}, {"self": -3}],
    "has(self.lastUpdatedTime)": [{"self": {}}, {"self": {"lastUpdatedTime": "2025-01-01T00:00:00Z"}}],
    "size(self.metadata.name) <= 63": [
        {"self": {"metadata": {"name": "a" * 63}}},
        {"self": {"metadata": {"name": "a" * 64}}},
        {"self": {"metadata": {"name": ""}}},
    ],
    "self.metadata.name.matches('^[a-z]([-a-z0-9]*[a-z0-9])?$')": [
        {"self": {"metadata": {"name": n}}}
        for n in ("ok", "ok-1", "Bad_Name", "1abc", "abc-", "a", "abc\n", "x.y")
    ],
}
GENERIC: list[Any] = [
    "",
    "hf://tatsu-lab/alpaca",
    "not a uri",
    "s3://bucket/key",
    "trainer.kubeflow.org/trainjob-controller",
    "kueue.x-k8s.io/multikueue",
    "other",
    ["node"],
    ["dataset-initializer"],
    [],
    {"torch": {}},
    {"torch": {}, "mpi": {}},
    {},
    {"templates": [{"metadata": {}}]},
    {"templates": [{"metadata": {"namespace": ""}}]},
    {"templates": [{"metadata": {"namespace": "x"}}]},
    {"templates": [{}]},
    {"replicatedJobs": [{"name": "a"}]},
    {"startupPolicy": {"startupPolicyOrder": "InOrder"}, "replicatedJobs": [{"name": "a", "dependsOn": []}]},
    {"startupPolicy": {"startupPolicyOrder": "AnyOrder"}, "replicatedJobs": [{"name": "a", "dependsOn": []}]},
    {"startupPolicy": {"startupPolicyOrder": "InOrder"}, "replicatedJobs": [{"name": "a"}]},
]


def _rules() -> Iterator[str]:
    for obj in crds.load_manifest_objects(manifests.CRDS_DIR):
        for version in obj["spec"]["versions"]:
            yield from _walk(version["schema"]["openAPIV3Schema"])


def _walk(schema: Any) -> Iterator[str]:
    if not isinstance(schema, dict):
        return
    for rule in schema.get("x-kubernetes-validations") or ():
        yield rule["rule"]
    for key in ("properties",):
        for sub in (schema.get(key) or {}).values():
            yield from _walk(sub)
    for key in ("items", "additionalProperties"):
        yield from _walk(schema.get(key))


RULES = sorted(set(_rules()))


def _outcome_ours(program: cel.Program, env: dict[str, Any]) -> Any:
    try:
        return program.evaluate(env)
    except cel.CelEvalError:
        return "error"


def _outcome_reference(program: Any, env: dict[str, Any]) -> Any:
    try:
        return program.execute(env)
    except Exception:  # the binding raises several types for evaluation errors
        return "error"


def test_the_crds_declare_rules() -> None:
    assert len(RULES) >= 10


@pytest.mark.parametrize("rule", RULES)
def test_rule_agrees_with_cel_rust(rule: str) -> None:
    ours = cel.compile_rule(rule)
    theirs = reference.compile(rule)
    envs = SAMPLES.get(rule) or [{"self": value} for value in GENERIC]
    for env in envs:
        expected = _outcome_reference(theirs, env)
        got = _outcome_ours(ours, env)
        assert got == expected, f"rule {rule!r} on {env!r}: simulator {got!r}, cel-rust {expected!r}"


@pytest.mark.parametrize(
    "source",
    [
        "1 + 2 * 3 == 7",
        "'abc'.startsWith('a') && !'abc'.endsWith('b')",
        "[1, 2, 3].map(x, x * 2) == [2, 4, 6]",
        "[1, 2, 3].exists_one(x, x > 2)",
        "{'a': 1}.all(k, k == 'a')",
        "true ? 1 : 2",
        "7 / 2 == 3 && -7 / 2 == -3 && 7 % 3 == 1",
        "1 == 1.0",
        "true == 1",
        "'a' < 'b'",
        "[1] + [2] == [1, 2]",
    ],
)
def test_operators_agree_with_cel_rust(source: str) -> None:
    assert _outcome_ours(cel.compile_rule(source), {}) == _outcome_reference(reference.compile(source), {})


def test_string_size_counts_code_points() -> None:
    # The CEL spec (and Kubernetes) count code points; the cel-rust binding counts UTF-8 bytes here.
    assert cel.compile_rule("size('héllo') == 5").evaluate({}) is True


def test_unsupported_rules_fail_at_compile_time() -> None:
    for source in ("self.all(x,", "quantity('1') > 0", "self.x.y()"):
        with pytest.raises(cel.CelCompileError):
            cel.compile_rule(source)
