"""hf_attn/modeling/ ships to the Hub flat: sibling imports `from .name import X`, torch, transformers, stdlib."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

MODELING = Path(__file__).resolve().parents[2] / "hf_attn" / "modeling"
ALLOWED_TOP = {"torch", "transformers", "huggingface_hub", "__future__"}  # huggingface_hub: transformers' own dependency


def test_modeling_files_import_only_siblings_torch_and_transformers():
    for path in sorted(MODELING.glob("*.py")):
        if path.name == "__init__.py":
            continue
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                if node.level:
                    assert node.level == 1 and node.module, f"{path.name}: use `from .name import X`, not {ast.unparse(node)}"
                    assert (MODELING / f"{node.module}.py").exists(), f"{path.name}: no sibling {node.module}.py"
                    continue
                names = [node.module]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            else:
                continue
            for name in names:
                top = name.split(".")[0]
                in_try = any(
                    isinstance(t, ast.Try) and any(n is node for n in ast.walk(t)) for t in ast.walk(tree)
                )
                assert top in ALLOWED_TOP or top in sys.stdlib_module_names or in_try, (
                    f"{path.name} imports {name}: model code may only need torch + transformers (optional extras "
                    "belong inside try/except)"
                )


def _imports(path: Path) -> list[str]:
    """The absolute module names a file imports (relative imports resolved against its package)."""
    package = ".".join(path.relative_to(MODELING.parents[1]).with_suffix("").parts[:-1])
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                out.append(f"{base}.{node.module}" if node.module else base)
            else:
                out.append(node.module)
        elif isinstance(node, ast.Import):
            out += [a.name for a in node.names]
    return out


def test_layers_analysis_and_data_never_import_training():
    """The layers: modeling (ships to the Hub) <- data, analysis (never training) <- training <- reproduce, CLI."""
    root = MODELING.parent
    for layer in ("analysis", "data", "modeling", "metrics"):
        for path in sorted((root / layer).glob("*.py")):
            bad = [m for m in _imports(path) if m.startswith(("hf_attn.training", "hf_attn.reproduce", "hf_attn.cli"))]
            assert not bad, f"{layer}/{path.name} imports {bad}: it must not depend on training, reproduce or the CLI"
    for path in sorted(root.rglob("*.py")):
        if "modeling" not in path.parts:
            continue
        bad = [m for m in _imports(path) if m.startswith("hf_attn.") and not m.startswith("hf_attn.modeling")]
        assert not bad, f"{path.name} imports {bad}"


def _sibling_imports(name: str) -> list[str]:
    """The sibling modules ``name``.py imports (``from .x import y``), in the order written."""
    tree = ast.parse((MODELING / f"{name}.py").read_text())
    return [n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.level == 1 and n.module]


def test_the_auto_map_modules_import_every_file_they_reach_directly():
    """transformers <= 5.9 copies, for a model loaded from a local directory, only the files an auto_map module imports
    directly; the version check comes first, before any file that could fail to import on an old transformers."""
    from hf_attn.modeling import BASES

    entries = {cls.__module__ for base in BASES.values() for cls in (base.model_class, base.config_class)}
    assert entries == {"hf_attn.modeling.modeling_hf_attn", "hf_attn.modeling.configuration_hf_attn"}
    for entry in sorted(e.rsplit(".", 1)[1] for e in entries):
        reached, todo = set(), [entry]
        while todo:
            for sibling in _sibling_imports(todo.pop()):
                if sibling not in reached:
                    reached.add(sibling)
                    todo.append(sibling)
        assert reached - {entry} <= set(_sibling_imports(entry)), f"{entry}.py must import these directly"
        assert _sibling_imports(entry)[0] == "compat", f"{entry}.py must import compat before any other sibling"
