"""docs/architecture.md is true of the tree, and the docs of the present stay so: every module of `app/` is
named in the rooms, the import rules it states are exactly the ones tested here (and hold), the modules it
calls long are exactly those above 400 lines, the glossary defines the project's words, and the benchmark and
reliability documents stay short and cite no commit (their run logs live in docs/archive/)."""

from __future__ import annotations

import ast
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support.markdown import headings

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
ARCHITECTURE = DOCS / "architecture.md"
APP = ROOT / "app"
SIM = ROOT / "sim" / "kubesim"


def section(text: str, title: str) -> str:
    """The body of the second-level section ``title`` (up to the next second-level heading)."""
    assert f"\n## {title}\n" in text, f"docs/architecture.md has no section {title!r}"
    return text.split(f"\n## {title}\n", 1)[1].split("\n## ", 1)[0]


ROOMS = section(ARCHITECTURE.read_text(encoding="utf-8"), "Rooms")


# ------------------------------------------------------------------------------------------- the rooms


def room_entries() -> dict[str, str]:
    """The rooms block's entries of `app`, each line that starts at column 0 with its continuation lines:
    {"app/kube/": "...", "app/cli.py, app/main.py": "...", ...} in the block's order."""
    block = ROOMS.split("```", 2)[1]
    entries: dict[str, str] = {}
    head = ""
    for line in block.splitlines():
        if line.startswith("app/"):
            head, _, rest = line.partition("  ")
            entries[head.strip()] = rest
        elif line.startswith(" ") and head:
            entries[head.strip()] += " " + line.strip()
        else:
            head = ""
    return entries


def room_of(module: Path) -> str:
    """The room of an `app` module: its top-level package ("app/kube/") or, for a module of `app` itself,
    the entry that names it ("app/cli.py, app/main.py")."""
    rel = module.relative_to(ROOT)
    if len(rel.parts) > 2:
        return f"app/{rel.parts[1]}/"
    for head in room_entries():
        if str(rel) in [name.strip() for name in head.split(",")]:
            return head
    raise AssertionError(f"{rel} heads no line of the rooms block of docs/architecture.md")


def app_modules() -> list[Path]:
    return sorted(p for p in APP.rglob("*.py") if p.name != "__init__.py")


@pytest.mark.parametrize("module", app_modules(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_module_of_app_is_named_in_its_room(module: Path) -> None:
    """A module is named by its path within its package (``lines.py``, ``auth/decision.py``) in its
    package's line of the rooms block, so a new module without a line there fails here."""
    room = room_of(module)
    if room.endswith("/"):
        name = str(module.relative_to(ROOT / room))
        text = room_entries()[room]
        assert re.search(rf"(?<![\w/]){re.escape(name)}\b", text), f"{name} is not named in the {room} room"


# ------------------------------------------------------------------------------------------ the imports


@dataclass(frozen=True)
class Import:
    source: Path  # the importing file
    module: str  # the module imported from, absolute ("app.kube.cache", "prometheus_client.core")
    top_level: bool  # at module level (False: inside a function or class)


def imports_of(tree_root: Path, base: Path) -> Iterator[Import]:
    """Every import of the modules under ``tree_root``, a folder of the top-level package in ``base``."""
    for path in sorted(tree_root.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        package = ".".join(path.relative_to(base).with_suffix("").parts[:-1])
        top = {id(node) for node in tree.body}
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    yield Import(path, alias.name, id(node) in top)
            elif isinstance(node, ast.ImportFrom):
                if node.level:  # relative: resolve against the importing package
                    parent = package.split(".")[: len(package.split(".")) - node.level + 1]
                    module = ".".join([*parent, node.module] if node.module else parent)
                else:
                    module = node.module or ""
                yield Import(path, module, id(node) in top)


def within(module: str, *packages: str) -> bool:
    return any(module == p or module.startswith(p + ".") for p in packages)


def layer_of(module: str) -> int:
    """The line of the rooms block a module of `app` belongs to (0 = the top)."""
    parts = module.split(".")
    name = f"app/{parts[1]}/" if len(parts) > 2 or (len(parts) == 2 and (APP / parts[1]).is_dir()) else ""
    if not name:
        name = f"app/{parts[1]}.py" if len(parts) == 2 else "app/version.py"  # `from app import __version__`
    for layer, head in enumerate(room_entries()):
        if name in [n.strip() for n in head.split(",")]:
            return layer
    raise AssertionError(f"{module} is in no line of the rooms block")


def module_name(path: Path, app: Path = APP) -> str:
    return ".".join(path.relative_to(app.parent).with_suffix("").parts)


HTTP_AND_PROMETHEUS = ("prometheus_client", "fastapi", "starlette", "uvicorn", "aiohttp")
LAZY_UPWARD = {("app/api/openapi_spec.py", "app.main")}


def broken_layers(app: Path) -> list[str]:
    out = []
    for imp in imports_of(app, app.parent):
        if not within(imp.module, "app"):
            continue
        here = module_name(imp.source, app)
        exception = (str(imp.source.relative_to(app.parent)), imp.module) in LAZY_UPWARD and not imp.top_level
        if layer_of(imp.module) < layer_of(here) and not exception:
            out.append(f"{here} imports {imp.module}, a line above it")
    return out


def kube_is_generic(app: Path) -> list[str]:
    out = []
    for imp in imports_of(app / "kube", app.parent):
        if within(imp.module, "app") and not within(imp.module, "app.kube"):
            out.append(f"{module_name(imp.source, app)} imports {imp.module}")
        if within(imp.module, "prometheus_client") and imp.source.name != "informer_telemetry.py":
            out.append(f"{module_name(imp.source, app)} imports {imp.module}")
    return out


def trainer_is_pure(app: Path) -> list[str]:
    return [
        f"{module_name(imp.source, app)} imports {imp.module}"
        for imp in imports_of(app / "trainer", app.parent)
        if within(imp.module, *HTTP_AND_PROMETHEUS, "kubernetes_asyncio")
        or (within(imp.module, "app") and not within(imp.module, "app.trainer", "app.kube"))
    ]


def metrics_does_no_kubernetes_io(app: Path) -> list[str]:
    return [
        f"{module_name(imp.source, app)} imports {imp.module}"
        for imp in imports_of(app / "metrics", app.parent)
        if within(imp.module, "app.kube", "aiohttp", "kubernetes_asyncio")
    ]


def handover_knows_no_http_or_prometheus(app: Path) -> list[str]:
    return [
        f"{module_name(imp.source, app)} imports {imp.module}"
        for imp in imports_of(app / "handover", app.parent)
        if within(imp.module, *HTTP_AND_PROMETHEUS)
    ]


def the_simulator_stays_apart(app: Path) -> list[str]:
    out = [
        f"{module_name(imp.source, app)} imports {imp.module}"
        for imp in imports_of(app, app.parent)
        if within(imp.module, "kubesim") and imp.source != app / "replica" / "simulate.py"
    ]
    out += [
        f"{imp.source} imports {imp.module}"
        for imp in imports_of(SIM, SIM.parent)
        if within(imp.module, "app")
    ]
    out += [
        f"{imp.source} imports {imp.module}"
        for imp in imports_of(SIM / "apiserver", SIM.parent)
        if within(imp.module, "kubesim.trainer")
    ]
    return out


# The rules docs/architecture.md states under "Import rules", by the words in bold that name each; each
# returns the imports of the `app` tree at its argument that break it.
RULES: dict[str, Callable[[Path], list[str]]] = {
    "layers": broken_layers,
    "kube is generic": kube_is_generic,
    "trainer is pure": trainer_is_pure,
    "metrics does no Kubernetes I/O": metrics_does_no_kubernetes_io,
    "handover knows no HTTP or Prometheus": handover_knows_no_http_or_prometheus,
    "the simulator stays apart": the_simulator_stays_apart,
}


def test_the_import_rules_stated_are_the_ones_tested() -> None:
    stated = re.findall(
        r"^- \*\*(.+?)\*\*:", section(ARCHITECTURE.read_text(encoding="utf-8"), "Import rules"), re.M
    )
    assert sorted(stated) == sorted(RULES)


@pytest.mark.parametrize("rule", sorted(RULES))
def test_import_rule_holds(rule: str) -> None:
    broken = RULES[rule](APP)
    assert not broken, "\n".join(broken)


def test_the_lazy_upward_import_is_still_needed_and_still_lazy() -> None:
    """The one exception of the layers rule names an import that exists, inside a function."""
    for source, module in LAZY_UPWARD:
        found = [imp for imp in imports_of(APP, ROOT) if imp.source == ROOT / source and imp.module == module]
        assert found and not any(imp.top_level for imp in found), (source, module, found)


def test_the_rules_catch_a_lazy_and_a_relative_breach(tmp_path: Path) -> None:
    """A function-level import is read like a top-level one and a relative import resolves to its package,
    so an empty result above means the tree keeps the rules, not that the checks see nothing."""
    kube = tmp_path / "app" / "kube"
    kube.mkdir(parents=True)
    (kube / "bad.py").write_text(
        "from .informer_telemetry import X\nfrom .. import config\n\n\n"
        "def f():\n    from app.trainer.kinds import TRAINJOBS\n    import prometheus_client\n"
    )
    assert kube_is_generic(tmp_path / "app") == [
        "app.kube.bad imports app",
        "app.kube.bad imports app.trainer.kinds",
        "app.kube.bad imports prometheus_client",
    ]


# ------------------------------------------------------------------------------------- the long modules


def test_the_long_modules_named_are_those_above_400_lines() -> None:
    text = ROOMS.split("Modules above 400 lines", 1)[1].split("Every other module is under 400 lines.", 1)[0]
    named = set(re.findall(r"^- `(app/[\w/]+\.py)`", text, re.M))
    long = {
        str(p.relative_to(ROOT))
        for p in app_modules()
        if len(p.read_text(encoding="utf-8").splitlines()) > 400
    }
    assert named == long, (
        f"named but not long: {sorted(named - long)}; long but not named: {sorted(long - named)}"
    )


# ------------------------------------------------------------------------------------------ the glossary

# The project's own words a newcomer meets in the code and the other documents.
TERMS = (
    "edge",
    "term",
    "journal",
    "watermark",
    "served ledger",
    "floor",
    "held edge",
    "born at zero",
    "served render",
    "seen",
    "crash bound",
    "tomb",
    "hand-over",
    "truth",
)


def test_the_glossary_defines_the_project_s_words() -> None:
    glossary = section(ARCHITECTURE.read_text(encoding="utf-8"), "Glossary")
    defined = {
        term
        for entry in re.findall(r"^- (.+?):", glossary, re.M)
        for term in re.findall(r"\*\*(.+?)\*\*", entry)
    }
    assert set(TERMS) <= defined, sorted(set(TERMS) - defined)


# ------------------------------------------------------------------------------ the docs of the present

# A commit cited by its hash: 7 to 40 hex digits with at least one letter and one digit, standing alone.
COMMIT = re.compile(r"(?<![\w/.-])(?=[0-9a-f]*[a-f])(?=[0-9a-f]*[0-9])[0-9a-f]{7,40}(?![\w-])")
# The project's own documents; docs/design/ cites upstream commits, docs/archive/ keeps the run logs.
OWN_DOCS = sorted(DOCS.glob("*.md"))


@pytest.mark.parametrize("doc", OWN_DOCS, ids=lambda p: p.name)
def test_the_docs_of_the_present_cite_no_commit(doc: Path) -> None:
    """History lives in git and docs/archive/. The generated "Run details" line of benchmarks.md is
    machine output (temporary paths, byte counts), not a citation."""
    cited = [
        f"{doc.name}:{number}: {match}"
        for number, line in enumerate(doc.read_text(encoding="utf-8").splitlines(), 1)
        if not line.startswith("Run details: ")
        for match in COMMIT.findall(line)
    ]
    assert not cited, "\n".join(cited)


@pytest.mark.parametrize("name", ["benchmarks.md", "reliability.md"])
def test_the_figures_documents_stay_short(name: str) -> None:
    lines = (DOCS / name).read_text(encoding="utf-8").count("\n")
    assert lines < 300, f"docs/{name} has {lines} lines: move run logs to a dated file of docs/archive/"


def test_the_commit_pattern_finds_a_hash_and_nothing_else() -> None:
    assert COMMIT.findall("before 6c33ac3, after 0ef3433e; issue 38, 1000001 jobs, /tmp/a1b2c3d4e/x") == [
        "6c33ac3",
        "0ef3433e",
    ]


def test_headings_parse() -> None:
    """The sections the tests above read exist as second-level headings."""
    titles = {title for _, level, title in headings(ARCHITECTURE.read_text(encoding="utf-8")) if level == 2}
    assert {"Rooms", "Import rules", "Glossary"} <= titles
