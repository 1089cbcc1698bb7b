"""The CEL rule compiler's evaluator builders: each takes the evaluators of its operands and returns the
closure that computes one operator, selection, function or macro with CEL's semantics (error absorption,
overload errors), so the parser (:mod:`kubesim.apiserver.schema.cel_parser`) only decides which one to build.
"""

from __future__ import annotations

import re
from typing import Any

from kubesim.apiserver.schema.cel_values import (
    CelEvalError,
    Env,
    Evaluator,
    as_bool,
    cel_equal,
    ordered,
    re2_pattern,
    type_name,
)


def variable(env: Env, name: str) -> Any:
    try:
        return env[name]
    except KeyError:
        raise CelEvalError(f"undeclared reference to '{name}'") from None


def logic(left: Evaluator, right: Evaluator, is_or: bool) -> Evaluator:
    # CEL is commutative here: an error on one side is absorbed when the other side decides the result.
    def run(env: Env) -> bool:
        err: CelEvalError | None = None
        try:
            a = as_bool(left(env))
            if a is is_or:
                return is_or
        except CelEvalError as exc:
            err = exc
        b = as_bool(right(env))
        if b is is_or:
            return is_or
        if err is not None:
            raise err
        return not is_or

    return run


def relation(op: str, left: Evaluator, right: Evaluator) -> Evaluator:
    if op == "==":
        return lambda env: cel_equal(left(env), right(env))
    if op == "!=":
        return lambda env: not cel_equal(left(env), right(env))
    return lambda env: ordered(op, left(env), right(env))


def membership(item: Evaluator, container: Evaluator) -> Evaluator:
    def run(env: Env) -> bool:
        value, seq = item(env), container(env)
        if isinstance(seq, list):
            return any(cel_equal(value, x) for x in seq)
        if isinstance(seq, dict):
            return value in seq
        raise CelEvalError(f"no such overload: {type_name(value)} in {type_name(seq)}")

    return run


def arith_apply(op: str, a: Any, b: Any) -> Any:
    mixed = isinstance(a, bool) or isinstance(b, bool) or type(a) is not type(b)
    negation = op == "-" and a == 0 and isinstance(b, int | float) and not isinstance(b, bool)
    if mixed and not negation:
        raise CelEvalError(f"no such overload: {type_name(a)} {op} {type_name(b)}")
    if op == "+":
        if isinstance(a, int | float | str | list):
            return a + b
    elif isinstance(a, int | float):
        if op == "-":
            return a - b
        if op == "*":
            return a * b
        if b == 0:
            raise CelEvalError("division by zero" if op == "/" else "modulus by zero")
        if isinstance(a, int):
            quotient = abs(a) // abs(b) * (1 if (a < 0) == (b < 0) else -1)  # truncates like Go
            return quotient if op == "/" else a - b * quotient
        if op == "/":
            return a / b
    raise CelEvalError(f"no such overload: {type_name(a)} {op} {type_name(b)}")


def arith(op: str, left: Evaluator, right: Evaluator) -> Evaluator:
    return lambda env: arith_apply(op, left(env), right(env))


def select(target: Evaluator, name: str) -> Evaluator:
    def run(env: Env) -> Any:
        value = target(env)
        if isinstance(value, dict):
            if name in value:
                return value[name]
            raise CelEvalError(f"no such key: {name}")
        raise CelEvalError(f"type '{type_name(value)}' does not support field selection")

    return run


def index(target: Evaluator, index: Evaluator) -> Evaluator:
    def run(env: Env) -> Any:
        value, key = target(env), index(env)
        if isinstance(value, list) and isinstance(key, int) and not isinstance(key, bool):
            if 0 <= key < len(value):
                return value[key]
            raise CelEvalError(f"index out of bounds: {key}")
        if isinstance(value, dict):
            if key in value:
                return value[key]
            raise CelEvalError(f"no such key: {key}")
        raise CelEvalError(f"no such overload: {type_name(value)}[{type_name(key)}]")

    return run


def size(target: Evaluator) -> Evaluator:
    def run(env: Env) -> int:
        value = target(env)
        if isinstance(value, str | list | dict):
            return len(value)
        raise CelEvalError(f"no such overload: size({type_name(value)})")

    return run


def conversion(name: str, arg: Evaluator) -> Evaluator:
    def run(env: Env) -> Any:
        value = arg(env)
        try:
            if name == "int" and not isinstance(value, bool):
                return int(value)
            if name == "string" and isinstance(value, str | int | float) and not isinstance(value, bool):
                return str(value)
        except ValueError:
            pass
        raise CelEvalError(f"no such overload: {name}({type_name(value)})")

    return run


def matches(target: Evaluator, pattern: Evaluator) -> Evaluator:
    cache: dict[str, re.Pattern[str]] = {}

    def run(env: Env) -> bool:
        text, pat = target(env), pattern(env)
        if not isinstance(text, str) or not isinstance(pat, str):
            raise CelEvalError(f"no such overload: matches({type_name(text)}, {type_name(pat)})")
        compiled = cache.get(pat)
        if compiled is None:
            compiled = cache[pat] = re2_pattern(pat)
        return compiled.search(text) is not None

    return run


def string_method(name: str, target: Evaluator, arg: Evaluator) -> Evaluator:
    def run(env: Env) -> bool:
        text, other = target(env), arg(env)
        if not isinstance(text, str) or not isinstance(other, str):
            raise CelEvalError(f"no such overload: {type_name(text)}.{name}({type_name(other)})")
        if name == "startsWith":
            return text.startswith(other)
        if name == "endsWith":
            return text.endswith(other)
        return other in text

    return run


def macro(name: str, target: Evaluator, var: str, body: Evaluator) -> Evaluator:
    def run(env: Env) -> Any:
        seq = target(env)
        if isinstance(seq, dict):
            items = list(seq)
        elif isinstance(seq, list):
            items = seq
        else:
            raise CelEvalError(f"no such overload: {type_name(seq)}.{name}()")
        scope = dict(env)

        def apply(item: Any) -> Any:
            scope[var] = item
            return body(scope)

        if name == "map":
            return [apply(item) for item in items]
        if name == "filter":
            return [item for item in items if as_bool(apply(item))]
        if name == "exists_one":
            return sum(1 for item in items if as_bool(apply(item))) == 1
        # all / exists: errors are absorbed when another element decides the result, as with && / ||.
        decisive = name == "exists"
        err: CelEvalError | None = None
        for item in items:
            try:
                if as_bool(apply(item)) is decisive:
                    return decisive
            except CelEvalError as exc:
                err = err or exc
        if err is not None:
            raise err
        return not decisive

    return run
