"""docs/api.md covers what the guides use: every public name of hf_attn.training, hf_attn.analysis and
hf_attn.metrics (their ``__all__``), every one the guides name, and generated tables of the configuration fields and
every variant hyperparameter (name, type, default, valid values, paper symbol) that agree with the declarations."""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import hf_attn
from hf_attn.errors import HfAttnInputError
from hf_attn.docgen import api_tables

ROOT = Path(__file__).resolve().parents[1]
API = (ROOT / "docs" / "api.md").read_text(encoding="utf-8")
DOCUMENTED = set(re.findall(r"^::: ([\w.]+)$", API, re.M))
PACKAGES = ("hf_attn.training", "hf_attn.analysis", "hf_attn.metrics")


def defined_at(obj) -> str:
    return f"{obj.__module__}.{obj.__qualname__}"


@pytest.mark.parametrize("package", PACKAGES)
def test_every_public_name_is_exported_and_documented_where_it_is_defined(package):
    module = importlib.import_module(package)
    assert module.__all__, package
    for name in module.__all__:
        obj = getattr(module, name)
        if inspect.isclass(obj) or inspect.isfunction(obj):
            assert defined_at(obj) in DOCUMENTED, f"{package}.{name}: no '::: {defined_at(obj)}' in docs/api.md"
        else:  # a constant (hf_attn.metrics.METRICS)
            assert f"{package}.{name}" in DOCUMENTED, f"{package}.{name}: no '::: {package}.{name}' in docs/api.md"
    assert set(dir(module)) >= set(module.__all__)


def test_every_name_the_guides_use_is_documented():
    """A dotted ``hf_attn.training/analysis/metrics`` name in the guides resolves, and a class or function it names is
    documented (under its defining module); a module it names exists."""
    used = set()
    for page in (ROOT / "docs").glob("*.md"):
        if page.name != "api.md":
            used |= set(re.findall(r"\bhf_attn\.(?:training|analysis|metrics)(?:\.\w+)+", page.read_text()))
    assert {"hf_attn.metrics.load_metric", "hf_attn.training.TrainingStepCallback"} <= used
    for dotted in sorted(used):
        parts = dotted.split(".")
        obj = importlib.import_module(".".join(parts[:2]))
        for i, part in enumerate(parts[2:], start=2):
            obj = getattr(obj, part, None) or importlib.import_module(".".join(parts[: i + 1]))
        if inspect.isclass(obj) or inspect.isfunction(obj):
            assert defined_at(obj) in DOCUMENTED, f"the guides use {dotted}, which docs/api.md does not document"


def test_every_documented_name_exists():
    for dotted in DOCUMENTED:
        module, _, name = dotted.rpartition(".")
        try:
            obj = importlib.import_module(dotted)
        except ModuleNotFoundError:
            obj = getattr(importlib.import_module(module), name, None)
        assert obj is not None, f"docs/api.md documents {dotted}, which does not exist"


def test_the_subpackages_import_their_names_on_first_use():
    """``import hf_attn`` loads none of training / analysis / metrics, and importing a light module of one (the
    command line's flag declarations) does not load transformers' Trainer or the analysis code."""
    code = ("import sys, hf_attn, hf_attn.training.validate, hf_attn.analysis.options; "
            "print(sorted(m for m in sys.modules if m.startswith(('hf_attn.training.', 'hf_attn.analysis.'))))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600,
                          env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin", "HF_HUB_OFFLINE": "1"})
    assert proc.returncode == 0, proc.stderr[-2000:]
    loaded = eval(proc.stdout.strip())
    assert "hf_attn.training.trainer" not in loaded and "hf_attn.analysis.stats" not in loaded, loaded
    from hf_attn import analysis, training
    assert training.HfAttnSeq2SeqTrainer.__module__ == "hf_attn.training.trainer"
    with pytest.raises(AttributeError, match="has no attribute 'nothing_here'"):
        analysis.nothing_here  # noqa: B018


# ----------------------------------------------------------------------- the configuration / hyperparameter tables
def test_the_tables_are_what_the_declarations_give():
    for path, text in api_tables.api_docs(ROOT).items():
        assert path.read_text(encoding="utf-8") == text, (
            f"{path.relative_to(ROOT)}: its tables differ from the declarations; run {api_tables.COMMAND}")
    block = API.split(api_tables.START)[1].split(api_tables.END)[0]
    for name, cls in hf_attn.ATTENTION_VARIANTS.items():
        assert f"#### `{name}`" in block
        for hp in cls.hyperparameters:
            row = next(line for line in block.splitlines() if line.startswith(f"| `{hp.name}` |"))
            cells = [c.strip().replace("\\|", "|") for c in re.split(r"(?<!\\)\|", row)[1:-1]]
            assert cells[1:5] == [hp.type_name(), f"`{hp.initial()!r}`", hp.valid_values(),
                                  hp.symbol or "(none: not in the paper)"], hp.name
    for field in ("encoder_attention", "cross_attention_layers", "preset"):
        assert f"| `{field}` |" in block


def test_the_papers_symbols_are_declared():
    hps = {hp.name: hp for cls in hf_attn.ATTENTION_VARIANTS.values() for hp in cls.hyperparameters}
    assert "epsilon" in hps["rela_eps"].symbol and "Eq. 4" in hps["rela_eps"].symbol
    assert hps["reluformer_gamma"].symbol == "gamma (Eq. 6)" and hps["gmm_num_components"].symbol.startswith("K")
    assert hps["calibration_lambda"].symbol == "lambda (Eq. 8)"
    with_symbol = {n for n, hp in hps.items() if hp.symbol}
    assert len(with_symbol) >= len(hps) * 2 // 3, f"most hyperparameters have a paper symbol: {sorted(with_symbol)}"
    # the symbol is optional, and keyword-only in use: older declarations without it still build
    assert dataclasses.replace(hps["rela_eps"], symbol="").symbol == ""


def test_presets_verbose_prints_the_paper_symbols(capsys):
    from hf_attn.cli import presets

    assert presets.run(["--verbose"]) == 0
    out = capsys.readouterr().out
    for cls in hf_attn.ATTENTION_VARIANTS.values():
        for hp in cls.hyperparameters:
            block = out.split(f"  --{hp.name} ", 1)[1].split("\n  --", 1)[0]
            assert (f"paper symbol: {hp.symbol}" in block) == bool(hp.symbol), hp.name


def test_the_tables_command_rewrites_a_changed_declaration(tmp_path, monkeypatch):
    (tmp_path / "docs").mkdir()
    shutil.copy(ROOT / "docs" / "api.md", tmp_path / "docs" / "api.md")
    assert api_tables.write_api_tables(tmp_path) == []
    rela = hf_attn.ATTENTION_VARIANTS["rela"]
    changed = tuple(dataclasses.replace(hp, symbol="a new symbol") if hp.name == "rela_eps" else hp
                    for hp in rela.hyperparameters)
    monkeypatch.setattr(rela, "hyperparameters", changed)
    assert api_tables.write_api_tables(tmp_path) == [tmp_path / "docs" / "api.md"]
    assert "| a new symbol |" in (tmp_path / "docs" / "api.md").read_text()
    (tmp_path / "docs" / "api.md").write_text("# API reference\n")
    with pytest.raises(HfAttnInputError, match="no block between <!-- api-tables:start -->"):
        api_tables.write_api_tables(tmp_path)
