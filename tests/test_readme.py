"""The README a newcomer reads first: short, the example and the two commands on its first screen, the example runs,
and its links lead somewhere."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
FIRST_SCREEN = 80  # lines: the install line, the example, the variants and the two commands come before it


def fenced_after(marker: str) -> str:
    block = README.split(marker, 1)[1]
    return re.search(r"```bash\n(.*?)\n```", block, re.S).group(1).strip()


def line_of(text: str) -> int:
    return README[: README.index(text)].count("\n") + 1


def test_readme_is_short():
    assert len(README.splitlines()) <= 250


@pytest.mark.slow
def test_first_screen_holds_the_example_and_the_two_commands_and_ci_runs_the_second():
    main_cmd, test_cmd = fenced_after("<!-- main-command -->"), fenced_after("<!-- test-command -->")
    assert "pip install torch==2.13.0" in main_cmd and "hf-attn train" in main_cmd
    assert "pytest" in test_cmd and "HF_HUB_OFFLINE=1" in test_cmd
    for text in ("```python", "<!-- main-command -->", "<!-- test-command -->", test_cmd):
        assert line_of(text) < FIRST_SCREEN, f"{text[:40]!r} is not on the README's first screen"
    assert line_of("```python") < line_of("<!-- main-command -->")  # the order the README promises
    extracted = subprocess.run(
        ["awk", "/<!-- test-command -->/{getline; getline; print; exit}", str(ROOT / "README.md")],
        capture_output=True, text=True, check=True,
    ).stdout.strip()
    assert extracted == test_cmd
    assert "test-command" in (ROOT / ".ci" / "run").read_text()


@pytest.mark.slow
def test_python_example_runs(tmp_path):
    """The README's example, as printed: a model from a preset, a training step's gradients, beam search."""
    example = re.search(r"```python\n(.*?)\n```", README, re.S).group(1)
    code = [n for n in ast.parse(example).body if not isinstance(n, (ast.Import, ast.ImportFrom))]
    assert len(code) <= 5, "the example grew beyond five statements"
    sizes = next(n.value for n in code if isinstance(n, ast.Assign) and n.targets[0].id == "sizes")
    stated = {k.arg: ast.literal_eval(k.value) for k in sizes.keywords}
    intro = README.split("**In Python**", 1)[1].split("```python", 1)[0]
    assert stated["encoder_layers"] == stated["decoder_layers"] == 2 and "2+2 layers" in intro  # the sizes it states
    heads = stated["encoder_attention_heads"]
    assert f"width {stated['d_model']}, {heads} heads of {stated['d_model'] // heads} dimensions" in intro
    probe = "\nassert all(p.grad is not None for p in model.parameters() if p.requires_grad)\nprint('EXAMPLE-OK')\n"
    proc = subprocess.run([sys.executable, "-c", example + probe], cwd=tmp_path, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "EXAMPLE-OK" in proc.stdout and "tensor([[" in proc.stdout  # the generated ids were printed


def test_install_text_gives_the_cpu_and_the_gpu_builds_and_the_transformers_pin():
    install = README.split("**Install**", 1)[1].split("**In Python**", 1)[0]
    assert "--index-url https://download.pytorch.org/whl/cpu" in install and "CUDA" in install
    pyproject = (ROOT / "pyproject.toml").read_text()
    pin = re.search(r'"transformers>=(\d+\.\d+),<(\d+)\.(\d+)"', pyproject)
    newest = f"{pin.group(2)}.{int(pin.group(3)) - 1}"
    torch_low = re.search(r'"torch>=(\d+\.\d+)"', pyproject).group(1)
    index = (ROOT / "docs" / "index.md").read_text()
    for page in (install, index):
        assert f"transformers {pin.group(1)} to {newest}" in page, "the stated transformers versions left the pin"
        assert f"torch {torch_low} or newer" in page, "the stated torch versions left the pin"


def test_readme_links_exist():
    targets = {t.split("#")[0] for t in re.findall(r"\]\(([^)\s]+)\)", README) if "://" not in t}
    missing = sorted(t for t in targets if t and not (ROOT / t).exists())
    assert not missing, f"README links to missing files: {missing}"


def test_every_paper_page_is_linked_from_the_variants_table():
    table = README.split("**The variants**", 1)[1].split("\n\n## ", 1)[0]
    pages = {p.relative_to(ROOT).as_posix() for p in (ROOT / "docs" / "papers").glob("*.md")}
    assert pages and pages <= set(re.findall(r"\((docs/papers/[\w-]+\.md)", table))
