"""labelSelector and fieldSelector of LIST and WATCH requests, parsed once per request into predicates over
stored entries (docs/design/k8s-protocol.md §1-§2).

Errors carry the apiserver's messages: clients show them, and a selector the real server rejects must not
work here.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from kubesim.apiserver.status import bad_request
from kubesim.apiserver.storage.table import Entry, Predicate

_LABEL_SET_RE = re.compile(r"^\s*(!?)\s*([A-Za-z0-9_./-]+)\s*(?:(in|notin)\s*\(([^)]*)\))?\s*$")
_LABEL_OP_RE = re.compile(r"^\s*([A-Za-z0-9_./-]+)\s*(==|!=|=)\s*([A-Za-z0-9_.-]*)\s*$")


Labels = dict[str, str]
LabelCheck = Callable[[Labels], bool]


def _label_equals(key: str, value: str, negate: bool) -> LabelCheck:
    def check(labels: Labels) -> bool:
        return (labels.get(key) == value) != negate

    return check


def _label_in(key: str, members: frozenset[str], negate: bool) -> LabelCheck:
    def check(labels: Labels) -> bool:
        # notin also matches objects without the label, as in apimachinery.
        return (labels.get(key) in members) != negate

    return check


def _label_exists(key: str, negate: bool) -> LabelCheck:
    def check(labels: Labels) -> bool:
        return (key in labels) != negate

    return check


def _split_terms(selector: str) -> list[str]:
    # Commas inside "in (a,b)" do not separate requirements.
    terms: list[str] = []
    depth = 0
    cur: list[str] = []
    for ch in selector:
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        if ch == "," and depth == 0:
            terms.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    terms.append("".join(cur))
    return [t for t in terms if t.strip()]


def parse_label_selector(selector: str) -> LabelCheck | None:
    """labelSelector with =, ==, !=, in, notin, key, !key; 400 on a parse error."""
    if not selector.strip():
        return None
    checks: list[LabelCheck] = []
    for term in _split_terms(selector):
        op = _LABEL_OP_RE.match(term)
        if op:
            key, operator, value = op.groups()
            checks.append(_label_equals(key, value, operator == "!="))
            continue
        st = _LABEL_SET_RE.match(term)
        if st is None:
            raise bad_request(
                f"unable to parse requirement: found '{term.strip()}', expected: valid selector"
            )
        negate, key, set_op, values = st.groups()
        if set_op:
            if negate:
                raise bad_request(f"unable to parse requirement: unexpected '!' before '{key}'")
            members = frozenset(v.strip() for v in values.split(",") if v.strip())
            checks.append(_label_in(key, members, set_op == "notin"))
        else:
            checks.append(_label_exists(key, bool(negate)))
    return lambda labels: all(check(labels) for check in checks)


def _key_part_equals(index: int, value: str, negate: bool) -> Predicate:
    def check(entry: Entry) -> bool:
        return (entry.key[index] == value) != negate

    return check


_FIELD_RE = re.compile(r"^\s*([A-Za-z0-9_.]+)\s*(==|!=|=)\s*(.*?)\s*$")


def parse_field_selector(selector: str) -> Predicate | None:
    """fieldSelector for custom resources: only metadata.name and metadata.namespace."""
    if not selector.strip():
        return None
    checks: list[Predicate] = []
    for term in selector.split(","):
        if not term.strip():
            continue
        m = _FIELD_RE.match(term)
        if m is None:
            raise bad_request(f"invalid selector: '{selector}'; can't understand '{term}'")
        fld, operator, value = m.groups()
        if fld == "metadata.name":
            index = 1
        elif fld == "metadata.namespace":
            index = 0
        else:
            raise bad_request(f"field label not supported: {fld}")
        checks.append(_key_part_equals(index, value, operator == "!="))
    return lambda e: all(check(e) for check in checks)


def selector_predicate(label_selector: str, field_selector: str) -> Predicate | None:
    """Both selectors as one predicate, or None when neither filters anything."""
    return _combine(parse_label_selector(label_selector), parse_field_selector(field_selector))


def _combine(label: LabelCheck | None, fld: Predicate | None) -> Predicate | None:
    if label is None:
        return fld
    if fld is None:
        return lambda e: label(e.labels)
    return lambda e: fld(e) and label(e.labels)
