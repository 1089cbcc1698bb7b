"""The CEL rule compiler's parser: a recursive-descent parser over :mod:`kubesim.apiserver.schema.cel_lexer`
tokens that builds the evaluator closures of :mod:`kubesim.apiserver.schema.cel_ops` as it goes (no separate
AST: each rule is compiled once and then only evaluated), refusing anything outside the supported subset at
compile
time.
"""

from __future__ import annotations

from typing import Any, Final

from kubesim.apiserver.schema import cel_ops as ops
from kubesim.apiserver.schema.cel_lexer import tokens
from kubesim.apiserver.schema.cel_ops import arith_apply, variable
from kubesim.apiserver.schema.cel_values import (
    CelCompileError,
    CelEvalError,
    Env,
    Evaluator,
    as_bool,
    type_name,
)

MACROS: Final = frozenset({"all", "exists", "exists_one", "filter", "map"})


class Parser:
    def __init__(self, text: str) -> None:
        self.toks = tokens(text)
        self.i = 0

    def peek(self, kind: str, value: Any = None) -> bool:
        tok = self.toks[self.i]
        return tok[0] == kind and (value is None or tok[1] == value)

    def take(self, kind: str, value: Any = None) -> Any:
        if not self.peek(kind, value):
            raise CelCompileError(f"expected {value or kind}, found {self.toks[self.i][1]!r}")
        tok = self.toks[self.i]
        self.i += 1
        return tok[1]

    def accept(self, kind: str, value: Any = None) -> bool:
        if self.peek(kind, value):
            self.i += 1
            return True
        return False

    # expr := or ('?' expr ':' expr)?
    def expr(self) -> Evaluator:
        cond = self.or_()
        if not self.accept("op", "?"):
            return cond
        yes = self.expr()
        self.take("op", ":")
        no = self.expr()
        return lambda env: yes(env) if as_bool(cond(env)) else no(env)

    def or_(self) -> Evaluator:
        left = self.and_()
        while self.accept("op", "||"):
            left = ops.logic(left, self.and_(), True)
        return left

    def and_(self) -> Evaluator:
        left = self.rel()
        while self.accept("op", "&&"):
            left = ops.logic(left, self.rel(), False)
        return left

    def rel(self) -> Evaluator:
        left = self.add()
        while True:
            if self.peek("op") and self.toks[self.i][1] in ("==", "!=", "<", "<=", ">", ">="):
                op = self.take("op")
                left = ops.relation(op, left, self.add())
            elif self.accept("ident", "in"):
                left = ops.membership(left, self.add())
            else:
                return left

    def add(self) -> Evaluator:
        left = self.mul()
        while self.peek("op") and self.toks[self.i][1] in ("+", "-"):
            left = ops.arith(self.take("op"), left, self.mul())
        return left

    def mul(self) -> Evaluator:
        left = self.unary()
        while self.peek("op") and self.toks[self.i][1] in ("*", "/", "%"):
            left = ops.arith(self.take("op"), left, self.unary())
        return left

    def unary(self) -> Evaluator:
        if self.accept("op", "!"):
            inner = self.unary()
            return lambda env: not as_bool(inner(env))
        if self.accept("op", "-"):
            neg = self.unary()
            return lambda env: arith_apply("-", 0, neg(env))
        return self.member()

    def member(self) -> Evaluator:
        node = self.primary()
        while True:
            if self.accept("op", "."):
                name = self.take("ident")
                node = self.method(node, name) if self.accept("op", "(") else ops.select(node, name)
            elif self.accept("op", "["):
                index = self.expr()
                self.take("op", "]")
                node = ops.index(node, index)
            else:
                return node

    def primary(self) -> Evaluator:
        if self.peek("lit"):
            value = self.take("lit")
            return lambda env: value
        if self.accept("op", "("):
            inner = self.expr()
            self.take("op", ")")
            return inner
        if self.accept("op", "["):
            items: list[Evaluator] = []
            while not self.accept("op", "]"):
                items.append(self.expr())
                if not self.accept("op", ","):
                    self.take("op", "]")
                    break
            return lambda env: [item(env) for item in items]
        if self.accept("op", "{"):
            pairs: list[tuple[Evaluator, Evaluator]] = []
            while not self.accept("op", "}"):
                key = self.expr()
                self.take("op", ":")
                pairs.append((key, self.expr()))
                if not self.accept("op", ","):
                    self.take("op", "}")
                    break
            return lambda env: {k(env): v(env) for k, v in pairs}
        name = self.take("ident")
        if self.accept("op", "("):
            if name == "has":
                return self.has()
            return self.function(name)
        return lambda env: variable(env, name)

    def args(self) -> list[Evaluator]:
        args: list[Evaluator] = []
        while not self.accept("op", ")"):
            args.append(self.expr())
            if not self.accept("op", ","):
                self.take("op", ")")
                break
        return args

    def has(self) -> Evaluator:
        start = self.i
        self.member()
        if not (self.toks[self.i - 1][0] == "ident" and self.toks[self.i - 2] == ("op", ".")):
            raise CelCompileError("has() needs a field selection, e.g. has(self.field)")
        field = self.toks[self.i - 1][1]
        # Re-parse the operand without its last selection: has(a.b) tests key b of a.
        sub = Parser.__new__(Parser)
        sub.toks = [*self.toks[start : self.i - 2], ("end", None)]
        sub.i = 0
        operand = sub.member()
        self.take("op", ")")

        def run(env: Env) -> bool:
            target = operand(env)
            if isinstance(target, dict):
                return field in target
            raise CelEvalError(f"has() on a {type_name(target)}")

        return run

    def function(self, name: str) -> Evaluator:
        args = self.args()
        if name == "size" and len(args) == 1:
            return ops.size(args[0])
        if name in ("int", "string") and len(args) == 1:
            return ops.conversion(name, args[0])
        if name == "matches" and len(args) == 2:
            return ops.matches(args[0], args[1])
        raise CelCompileError(f"unsupported function {name}/{len(args)}")

    def method(self, target: Evaluator, name: str) -> Evaluator:
        if name in MACROS:
            var = self.take("ident")
            self.take("op", ",")
            body = self.expr()
            self.take("op", ")")
            return ops.macro(name, target, var, body)
        args = self.args()
        if name == "size" and not args:
            return ops.size(target)
        if name == "matches" and len(args) == 1:
            return ops.matches(target, args[0])
        if name in ("startsWith", "endsWith", "contains") and len(args) == 1:
            return ops.string_method(name, target, args[0])
        raise CelCompileError(f"unsupported method {name}/{len(args)}")
