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
