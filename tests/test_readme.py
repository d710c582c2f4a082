"""The README describes what the code does: its commands, its preset table, its snippet."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import hf_attn

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()


def fenced_after(marker: str) -> str:
    block = README.split(marker, 1)[1]
    return re.search(r"```bash\n(.*?)\n```", block, re.S).group(1).strip()


def test_readme_starts_with_the_two_commands_and_ci_runs_the_second():
    main_cmd, test_cmd = fenced_after("<!-- main-command -->"), fenced_after("<!-- test-command -->")
    first_two = re.findall(r"```bash\n(.*?)\n```", README, re.S)[:2]
    assert first_two == [main_cmd, test_cmd]
    assert "pip install torch==2.13.0" in main_cmd and "hf-attn train" in main_cmd
    assert "pytest" in test_cmd and "HF_HUB_OFFLINE=1" in test_cmd
    extracted = subprocess.run(
        ["awk", "/<!-- test-command -->/{getline; getline; print; exit}", str(ROOT / "README.md")],
        capture_output=True, text=True, check=True,
    ).stdout.strip()
    assert extracted == test_cmd
    assert "test-command" in (ROOT / ".ci" / "run").read_text()


def test_every_preset_is_in_the_readme():
    missing = [name for name in hf_attn.PRESETS if f"`{name}`" not in README]
    assert not missing, f"presets missing from README.md: {missing}"


def test_python_snippet_runs(tmp_path):
    snippet = re.search(r"## Using it from Python\n\n```python\n(.*?)\n```", README, re.S).group(1)
    proc = subprocess.run([sys.executable, "-c", snippet], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert (tmp_path / "my-rela-model" / "model.safetensors").exists()
