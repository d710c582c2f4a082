"""The project's size rules: no file in hf_attn/ over 500 lines, no function over 80 (read with ast, decorators and
docstring included)."""

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "hf_attn"
MAX_FILE_LINES, MAX_FUNCTION_LINES = 500, 80
SOURCES = sorted(PACKAGE.rglob("*.py"))


def long_functions(source: str, limit: int = MAX_FUNCTION_LINES) -> list[tuple[str, int]]:
    """(qualified name, lines) of each function or method in ``source`` longer than ``limit`` lines."""
    found = []

    def visit(node, prefix):
        for child in ast.iter_child_nodes(node):
            name = prefix
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                name = f"{prefix}{child.name}."
                if not isinstance(child, ast.ClassDef):
                    first = min([child.lineno] + [d.lineno for d in child.decorator_list])
                    length = child.end_lineno - first + 1
                    if length > limit:
                        found.append((name[:-1], length))
            visit(child, name)

    visit(ast.parse(source), "")
    return found


def test_the_package_has_sources():
    assert len(SOURCES) > 50 and PACKAGE / "report" / "claims.py" in SOURCES


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_file_and_function_lengths(path):
    source = path.read_text(encoding="utf-8")
    lines = len(source.splitlines())
    assert lines <= MAX_FILE_LINES, f"{path.relative_to(PACKAGE.parent)} has {lines} lines (limit {MAX_FILE_LINES})"
    assert long_functions(source) == [], f"{path.relative_to(PACKAGE.parent)}: functions over {MAX_FUNCTION_LINES} lines"


def test_long_functions_finds_nested_and_decorated_ones():
    body = "\n".join(f"    x{i} = {i}" for i in range(80))
    source = f"class A:\n    @staticmethod\n    def f():\n{body.replace('    ', '        ')}\n\ndef g():\n    pass\n"
    assert long_functions(source) == [("A.f", 82)]
    assert long_functions(f"def outer():\n    def inner():\n{body.replace('    ', '        ')}\n") == [
        ("outer", 82), ("outer.inner", 81)]
