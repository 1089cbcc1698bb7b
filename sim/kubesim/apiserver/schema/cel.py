"""The CEL subset the Trainer CRDs' ``x-kubernetes-validations`` rules use, compiled to Python closures.

Why not a CEL library at run time: two maintained evaluators were measured on these rules (cel-python,
pure Python: ~580 µs per evaluation; common-expression-language, the cel-rust binding: 20-75 µs per
evaluation, most of it converting the Python value and compiling ``matches`` regexes on every call). A
simulated create costs ~200 µs in all, and bulk populate (100k TrainJobs) must not get slower, so rules are
compiled here once per CRD and cost a few µs. tests/kubesim/apiserver/test_cel.py evaluates every rule of
the vendored CRDs with both this compiler and common-expression-language on the same inputs and requires
equal results.

Supported (everything the Trainer CRDs declare, plus the obvious neighbours):
- literals: int, double, string ('..' and "..", escapes), true, false, null, lists ``[..]``, maps ``{..}``;
- identifiers ``self``, ``oldSelf`` and macro variables; field selection ``a.b``; index ``a[i]``/``a['k']``;
- operators ``! - * / % + - < <= > >= == != in && || ?:`` with CEL's error absorption for ``&&``/``||``;
- ``has(a.b)``; macros ``all exists exists_one filter map`` over lists (elements) and maps (keys);
- functions ``size`` (global and method), ``matches``, ``startsWith``, ``endsWith``, ``contains``,
  ``int``, ``string``.
The rules these CRDs declare: ``self == oldSelf``; ``self >= 1``; ``has(self.lastUpdatedTime)``;
``self in [..]``; ``self == '' || self.matches(..)``; ``!self.exists(c, c == 'node')``;
``size(self.metadata.name) <= 63``; ``self.metadata.name.matches(..)``; ``[has(..), ..].filter(x, x).size()
<= 1``; ``self.templates.all(t, !has(t.metadata.namespace) || size(t.metadata.namespace) == 0)``;
``!(has(self.startupPolicy) && .. == 'InOrder' && self.replicatedJobs.exists(x, has(x.dependsOn)))``.
Anything else fails at compile time (:class:`CelCompileError`), so a new CRD rule cannot be skipped silently.

Regexes follow RE2 as CEL does, as far as Python's ``re`` can: ``matches`` is a search (unanchored), and an
unescaped ``$`` outside a character class is made ``\\Z`` (RE2's ``$`` never matches before a final newline).
"""

from __future__ import annotations

from typing import Any

from kubesim.apiserver.schema.cel_parser import Parser
from kubesim.apiserver.schema.cel_values import (
    CelCompileError,
    CelEvalError,
    Env,
    Evaluator,
    cel_equal,
    re2_pattern,
)

# The compiler's pieces live in cel_values (value semantics, errors), cel_lexer, cel_parser and cel_ops;
# callers import the compiler's public names from here.
__all__ = [
    "CelCompileError",
    "CelEvalError",
    "Env",
    "Evaluator",
    "Program",
    "cel_equal",
    "compile_rule",
    "re2_pattern",
]


class Program:
    """One compiled rule: ``evaluate({"self": ..., "oldSelf": ...})`` returns its value or raises."""

    __slots__ = ("_run", "self_fields", "source", "uses_old_self")

    def __init__(self, source: str) -> None:
        self.source = source
        parser = Parser(source)
        self._run = parser.expr()
        parser.take("end")
        toks = parser.toks
        self.uses_old_self = any(tok == ("ident", "oldSelf") for tok in toks)
        # The fields of ``self`` the rule reads, when it only ever selects them (``self.metadata.name``):
        # the rule's result depends on nothing else, which lets an update skip it when they are unchanged.
        fields: set[str] | None = set()
        for i, tok in enumerate(toks):
            if tok == ("ident", "self") and fields is not None:
                follows = toks[i + 1 : i + 3]
                if len(follows) == 2 and follows[0] == ("op", ".") and follows[1][0] == "ident":
                    fields.add(follows[1][1])
                else:
                    fields = None
        self.self_fields: frozenset[str] | None = None if fields is None else frozenset(fields)

    def evaluate(self, env: Env) -> Any:
        try:
            return self._run(env)
        except RecursionError:
            raise CelEvalError("expression too deeply nested") from None


def compile_rule(source: str) -> Program:
    return Program(source)
