"""The CEL rule compiler's lexer: rule text to ``(kind, value)`` tokens, literals already decoded, so the
parser (:mod:`kubesim.apiserver.schema.cel_parser`) only deals with structure.
"""

from __future__ import annotations

import re
from typing import Any, Final

from kubesim.apiserver.schema.cel_values import CelCompileError

TOKEN_RE: Final = re.compile(
    r"""\s*(?:
      (?P<num>\d+\.\d*(?:[eE][+-]?\d+)?|\d+[eE][+-]?\d+|0x[0-9a-fA-F]+|\d+)(?P<unsigned>[uU])?
    | (?P<str>"(?:[^"\\\n]|\\.)*"|'(?:[^'\\\n]|\\.)*')
    | (?P<ident>[A-Za-z_][A-Za-z0-9_]*)
    | (?P<op>==|!=|<=|>=|&&|\|\||[-+*/%<>!?:.,()\[\]{}])
    )""",
    re.VERBOSE,
)
ESCAPES: Final = {"n": "\n", "t": "\t", "r": "\r", "\\": "\\", "'": "'", '"': '"', "`": "`", "?": "?"}


def tokens(text: str) -> list[tuple[str, Any]]:
    out: list[tuple[str, Any]] = []
    pos = 0
    text = text.rstrip()
    while pos < len(text):
        m = TOKEN_RE.match(text, pos)
        if m is None or m.end() == pos:
            raise CelCompileError(f"unexpected character at {pos}: {text[pos : pos + 10]!r}")
        pos = m.end()
        if m.group("num") is not None:
            raw = m.group("num")
            value: Any = (
                float(raw) if ("." in raw or "e" in raw.lower()) and not raw.startswith("0x") else None
            )
            if value is None:
                value = int(raw, 16) if raw.startswith("0x") else int(raw)
            out.append(("lit", value))
        elif m.group("str") is not None:
            out.append(("lit", unquote(m.group("str"))))
        elif m.group("ident") is not None:
            word = m.group("ident")
            if word in ("true", "false"):
                out.append(("lit", word == "true"))
            elif word == "null":
                out.append(("lit", None))
            else:
                out.append(("ident", word))
        else:
            out.append(("op", m.group("op")))
    out.append(("end", None))
    return out


def unquote(raw: str) -> str:
    body = raw[1:-1]
    out: list[str] = []
    i = 0
    while i < len(body):
        ch = body[i]
        if ch == "\\" and i + 1 < len(body):
            nxt = body[i + 1]
            if nxt in ESCAPES:
                out.append(ESCAPES[nxt])
                i += 2
                continue
            if nxt == "u" and i + 5 < len(body):
                out.append(chr(int(body[i + 2 : i + 6], 16)))
                i += 6
                continue
            raise CelCompileError(f"unsupported escape \\{nxt}")
        out.append(ch)
        i += 1
    return "".join(out)
