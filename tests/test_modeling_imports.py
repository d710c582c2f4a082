"""hf_attn/modeling/ ships to the Hub flat: sibling imports `from .name import X`, torch, transformers, stdlib."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

MODELING = Path(__file__).resolve().parents[1] / "hf_attn" / "modeling"
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
