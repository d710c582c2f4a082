"""No import cycles inside hf_attn/: every import counts, those inside functions too (they hide cycles, not cut them).
And the CLI owns argument parsing: no module outside hf_attn/cli/ imports argparse or `HfArgumentParser`."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "hf_attn"


def modules(root: Path) -> dict[str, tuple[Path, bool]]:
    """Dotted module name -> (file, is a package ``__init__``) for every ``.py`` file under ``root``."""
    out = {}
    for path in sorted(root.rglob("*.py")):
        parts = list(path.relative_to(root.parent).with_suffix("").parts)
        is_package = parts[-1] == "__init__"
        out[".".join(parts[:-1] if is_package else parts)] = (path, is_package)
    return out


def import_graph(root: Path) -> dict[str, set[str]]:
    """Module -> the package modules it imports anywhere in its file (relative imports resolved; ``from pkg import
    name`` counts as importing ``pkg.name`` when that is a module, else ``pkg``)."""
    known = modules(root)
    top = root.name
    graph: dict[str, set[str]] = {}
    for name, (path, is_package) in known.items():
        package = name if is_package else name.rpartition(".")[0]
        targets = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                targets.update(a.name for a in node.names)
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    parts = package.split(".")
                    base = ".".join(parts[: len(parts) - node.level + 1])
                    module = f"{base}.{node.module}" if node.module else base
                else:
                    module = node.module or ""
                targets.update(f"{module}.{a.name}" if f"{module}.{a.name}" in known else module for a in node.names)
        graph[name] = {t for t in targets if t.split(".")[0] == top and t in known and t != name}
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle as ``[a, b, ..., a]``, or None (depth-first search, in sorted order: deterministic)."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        path.pop()
        state[node] = 2
        return None

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10 * len(graph) + 100))
    for start in sorted(graph):
        if start not in state and (found := visit(start)):
            return found
    return None


PARSERS = ("argparse", "HfArgumentParser", "hf_argparser")  # the modules and the class that parse command lines


def parser_imports(root: Path) -> dict[str, list[str]]:
    """Module -> what it imports (or reaches as ``transformers.HfArgumentParser``) of `PARSERS`, anywhere in its file,
    for every module of ``root`` outside its ``cli/`` package."""
    out = {}
    for name, (path, _) in modules(root).items():
        if path.relative_to(root).parts[0] == "cli":
            continue
        found = []
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                found += [a.name for a in node.names if set(a.name.split(".")) & set(PARSERS)]
            elif isinstance(node, ast.ImportFrom):
                module = node.module or ""
                if set(module.split(".")) & set(PARSERS):
                    found.append(module)
                found += [f"{module}.{a.name}" for a in node.names if a.name in PARSERS]
            elif isinstance(node, ast.Attribute) and node.attr in PARSERS:
                found.append(ast.unparse(node))
        if found:
            out[name] = found
    return out


def test_the_graph_sees_function_level_and_relative_imports(tmp_path):
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from .sub import b\n")
    (pkg / "sub" / "b.py").write_text("def f():\n    from ..a import x\n    return x\n")
    graph = import_graph(pkg)
    assert graph["pkg.a"] == {"pkg.sub.b"} and graph["pkg.sub.b"] == {"pkg.a"}
    assert find_cycle(graph) == ["pkg.a", "pkg.sub.b", "pkg.a"]
    (pkg / "sub" / "b.py").write_text("import json\n")
    assert find_cycle(import_graph(pkg)) is None


def test_hf_attn_has_no_import_cycles():
    graph = import_graph(PACKAGE)
    assert len(graph) > 50 and graph["hf_attn.swap"]  # the whole package was read
    cycle = find_cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_the_parser_scan_sees_every_way_in(tmp_path):
    pkg = tmp_path / "pkg"
    (pkg / "cli").mkdir(parents=True)
    for init in (pkg / "__init__.py", pkg / "cli" / "__init__.py"):
        init.write_text("")
    (pkg / "cli" / "train.py").write_text("import argparse\nfrom transformers import HfArgumentParser\n")
    (pkg / "client.py").write_text("import json\n")
    assert parser_imports(pkg) == {}  # the cli/ package may parse; a look-alike name that does not is not flagged
    (pkg / "client.py").write_text("def f():\n    import argparse\n    return argparse\n")
    (pkg / "a.py").write_text("from transformers import HfArgumentParser, Seq2SeqTrainingArguments\n")
    (pkg / "b.py").write_text("import transformers\nP = transformers.HfArgumentParser\n")
    (pkg / "c.py").write_text("from argparse import ArgumentTypeError as E\nfrom transformers.hf_argparser import x\n")
    assert parser_imports(pkg) == {"pkg.client": ["argparse"], "pkg.a": ["transformers.HfArgumentParser"],
                                   "pkg.b": ["transformers.HfArgumentParser"],
                                   "pkg.c": ["argparse", "transformers.hf_argparser"]}


def test_only_the_cli_parses_arguments():
    """analysis/, reproduce/, training/ and the rest expose functions with typed parameters; hf_attn/cli/ parses."""
    assert (PACKAGE / "cli" / "train_args.py").is_file()  # the scan skips the right folder
    found = parser_imports(PACKAGE)
    assert not found, "argument parsing outside hf_attn/cli/: " + "; ".join(
        f"{name} imports {', '.join(what)}" for name, what in sorted(found.items()))


# ------------------------------------------------------------------------- the rooms of `hf-attn reproduce`
# The runner (hf_attn/reproduce/: what trains or runs processes) may import the report; the report
# (hf_attn/report/) reads the records and the definitions of the runs (hf_attn/plans/) and never reaches the runner or
# training; the generated documentation blocks of the code's declarations (hf_attn/docgen/) reach neither.
RUNNER = ("hf_attn.reproduce.runner", "hf_attn.reproduce.slot", "hf_attn.reproduce.run_extras")
FLOORS = {  # package -> the packages none of its modules may reach, through any chain of imports
    "hf_attn.report": ("hf_attn.reproduce", "hf_attn.training", "hf_attn.cli"),
    "hf_attn.plans": ("hf_attn.report", "hf_attn.reproduce", "hf_attn.training", "hf_attn.cli"),
    "hf_attn.docgen": ("hf_attn.report", "hf_attn.plans", "hf_attn.reproduce", "hf_attn.training", "hf_attn.cli"),
}
BLOCK_WRITERS = ("with_marked_block", "replace_marked_block")  # io_utils: how a generated block gets into a file


def inside(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def breaches(graph: dict[str, set[str]], package: str, forbidden) -> list[str]:
    """``a -> b -> ... -> x`` for each module of ``package`` that reaches a module ``x`` inside one of ``forbidden``
    (breadth first: the shortest chain to the first forbidden module on each way)."""
    out = []
    for start in sorted(m for m in graph if inside(m, package)):
        seen, queue = {start: [start]}, [start]
        while queue:
            node = queue.pop(0)
            for nxt in sorted(graph.get(node, ())):
                if nxt in seen:
                    continue
                seen[nxt] = seen[node] + [nxt]
                if any(inside(nxt, f) for f in forbidden):
                    out.append(" -> ".join(seen[nxt]))
                else:
                    queue.append(nxt)
    return out


def block_writers(root: Path) -> set[str]:
    """The modules of ``root`` that write generated documentation blocks: those that use io_utils' `BLOCK_WRITERS`
    (imported or reached as an attribute, anywhere in the file), the modules of the ``docgen`` package and every
    module that imports one of them."""
    graph, out = import_graph(root), set()
    for name, (path, _) in modules(root).items():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if (isinstance(node, ast.ImportFrom) and any(a.name in BLOCK_WRITERS for a in node.names)) or (
                    isinstance(node, ast.Attribute) and node.attr in BLOCK_WRITERS):
                out.add(name)
        if any(inside(t, f"{root.name}.docgen") for t in graph[name]) or inside(name, f"{root.name}.docgen"):
            out.add(name)
    return out


def test_the_floor_scans_see_a_forbidden_import(tmp_path):
    pkg = tmp_path / "pkg"
    for sub in ("report", "reproduce", "docgen"):
        (pkg / sub).mkdir(parents=True)
        (pkg / sub / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "io_utils.py").write_text("def with_marked_block(): ...\n")
    (pkg / "report" / "tables.py").write_text("import json\n")
    (pkg / "reproduce" / "runner.py").write_text("from ..report import tables\n")
    (pkg / "docgen" / "pages.py").write_text("PAGES = {}\n")
    floors = {"pkg.report": ("pkg.reproduce",)}
    assert breaches(import_graph(pkg), "pkg.report", floors["pkg.report"]) == []
    assert block_writers(pkg) == {"pkg.docgen", "pkg.docgen.pages"}
    (pkg / "report" / "tables.py").write_text("def f():\n    from . import helper\n")
    (pkg / "report" / "helper.py").write_text("from ..reproduce.runner import x\n")  # two steps away, in a function
    assert breaches(import_graph(pkg), "pkg.report", floors["pkg.report"]) == [
        "pkg.report.helper -> pkg.reproduce.runner",
        "pkg.report.tables -> pkg.report.helper -> pkg.reproduce.runner"]
    (pkg / "reproduce" / "runner.py").write_text("def f():\n    from .. import io_utils\n    io_utils.with_marked_block()\n")
    (pkg / "reproduce" / "slot.py").write_text("from ..docgen.pages import PAGES\n")
    (pkg / "reproduce" / "cards.py").write_text("from ..io_utils import with_marked_block as w\n")
    assert block_writers(pkg) == {"pkg.docgen", "pkg.docgen.pages", "pkg.reproduce.runner", "pkg.reproduce.slot",
                                  "pkg.reproduce.cards"}


def test_the_report_never_reaches_the_runner_or_training():
    """The report package imports (anywhere in its files, through any chain) no runner module, nothing of
    hf_attn/reproduce/, training/ or cli/; the definitions of the runs (plans/) and the documentation generators
    (docgen/) stay below it."""
    graph = import_graph(PACKAGE)
    assert all(name in graph for name in RUNNER) and graph["hf_attn.report.report"]  # the scan reads these rooms
    assert breaches(graph, "hf_attn.reproduce", ("hf_attn.report",))  # the runner does write the report
    found = [chain for package, forbidden in FLOORS.items() for chain in breaches(graph, package, forbidden)]
    assert not found, "a floor imports upward:\n" + "\n".join(found)


def test_reproduce_writes_no_documentation_blocks():
    """No module of hf_attn/reproduce/ writes a generated documentation block (the runner calls the report, which
    writes the README's and the paper pages' blocks); the generators of the code's blocks live in hf_attn/docgen/."""
    writers = block_writers(PACKAGE)
    assert {"hf_attn.docgen.citation_docs", "hf_attn.docgen.api_tables", "hf_attn.report.readme",
            "hf_attn.report.paper_pages"} <= writers  # the scan sees the writers
    found = sorted(name for name in writers if inside(name, "hf_attn.reproduce"))
    assert not found, f"hf_attn/reproduce/ writes documentation blocks in {found}: move that into hf_attn/docgen/"
    assert not {path.stem for path in (PACKAGE / "reproduce").glob("*.py")} & {
        path.stem for path in (PACKAGE / "docgen").glob("*.py") if path.stem != "__init__"}
