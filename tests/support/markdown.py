"""What the documentation tests read from Markdown: headings and their GitHub anchors, relative links, and
the expressions of ```promql blocks."""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass

FENCE = re.compile(r"^\s*(```|~~~)")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
# An inline link or image, [text](target "title"): the target up to a space or the closing parenthesis.
LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
CODE_SPAN = re.compile(r"(`+)(.+?)\1")


def prose_lines(text: str) -> list[tuple[int, str]]:
    """(line number, line) of every line outside fenced code blocks."""
    out, fenced = [], False
    for number, line in enumerate(text.splitlines(), start=1):
        if FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            out.append((number, line))
    return out


def headings(text: str) -> list[tuple[int, int, str]]:
    """(line number, level, text) of every ATX heading outside code blocks."""
    found = []
    for number, line in prose_lines(text):
        if m := HEADING.match(line):
            found.append((number, len(m.group(1)), m.group(2)))
    return found


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: its rendered text (code spans and links as their text, emphasis marks
    dropped) in lower case, every character that is not a letter, digit, space, hyphen or underscore dropped,
    then each space a hyphen."""
    text = CODE_SPAN.sub(lambda m: m.group(2), heading)
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", text)
    text = re.sub(r"<[^>]+>", "", text)
    text = text.replace("*", "")
    text = "".join(c for c in text.lower() if c.isalnum() or c in " -_")
    return text.replace(" ", "-")


def anchors(text: str) -> set[str]:
    """Every anchor GitHub gives the headings of a Markdown text (a repeated one gets -1, -2...)."""
    seen: Counter[str] = Counter()
    out = set()
    for _, _, heading in headings(text):
        base = slug(heading)
        out.add(base if not seen[base] else f"{base}-{seen[base]}")
        seen[base] += 1
    return out


@dataclass(frozen=True)
class Link:
    line: int
    target: str  # as written: path, path#anchor or #anchor


def links(text: str) -> list[Link]:
    """Every inline link outside code blocks and code spans (its text may run over lines)."""
    prose = dict(prose_lines(text))
    lines = [CODE_SPAN.sub("", prose.get(n, "")) for n in range(1, len(text.splitlines()) + 1)]
    joined = "\n".join(lines)
    return [Link(joined.count("\n", 0, m.start()) + 1, m.group(1)) for m in LINK.finditer(joined)]


def is_external(target: str) -> bool:
    return bool(re.match(r"^[a-z][a-z0-9+.-]*:", target, flags=re.I))


def promql_examples(text: str) -> list[str]:
    """The expressions of every ```promql block: separated by blank lines, `#` comment lines dropped."""
    exprs = []
    for block in re.findall(r"^```promql\n(.*?)^```", text, flags=re.S | re.M):
        for chunk in re.split(r"\n\s*\n", block):
            lines = [line for line in chunk.splitlines() if line.strip()]
            if expr := [line for line in lines if not line.lstrip().startswith("#")]:
                exprs.append("\n".join(expr))
    return exprs
