"""Models saved by an earlier hf-attn release still load, with the newest code, and give the same logits and beams.

`tests/fixtures/saved-177819a/` holds tiny models (`saved_models.SIZES`) saved with ``save_pretrained`` by the code
of commit 177819a (hf-attn 0.1.0, before the Hub-reach work of issue 51), one preset per variant family on Marian and
three on BART, with their outputs on `saved_models.fixed_input` in that environment (torch 2.13, transformers
5.24). ``save_pretrained`` copies the same model code into every directory: it is stored once, in ``code/``, and put
back beside each model's files here.

Written once, by ``PYTHONPATH=tests python tests/hub/test_earlier_saves.py --write`` at that commit; never rewritten
(the write refuses an existing directory): a later release must load these files as they are.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest
import torch

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "saved-177819a"
MODELS = [("marian", p) for p in ("softmax", "entmax15", "rela-g", "gmm", "reluformer", "ran-d", "hard-gaussian",
                                  "calibration-gate")] + [("bart", p) for p in ("rela-g", "gmm", "ran-all")]


def model_name(base: str, preset: str) -> str:
    return f"{base}-{preset}"


def saved_directory(name: str, into: Path) -> Path:
    """The fixture's model ``name`` as ``save_pretrained`` wrote it: its own files plus the shared ``code/``."""
    target = into / name
    shutil.copytree(FIXTURE / name, target)
    for code in sorted((FIXTURE / "code").glob("*.py")):
        shutil.copy(code, target / code.name)
    return target


@pytest.fixture(scope="module")
def expected() -> dict:
    return torch.load(FIXTURE / "outputs.pt")


def test_the_fixture_is_small_and_complete():
    size = sum(p.stat().st_size for p in FIXTURE.rglob("*") if p.is_file())
    assert size < 800_000, f"{size} bytes"
    assert sorted(p.name for p in FIXTURE.iterdir() if p.is_dir()) == sorted(["code", *(model_name(*m) for m in
                                                                                       MODELS)])


@pytest.mark.parametrize("base, preset", MODELS, ids=lambda x: x)
def test_a_model_saved_by_an_earlier_release_loads_with_equal_outputs(base, preset, expected, tmp_path):
    from saved_models import compare, outputs
    from transformers import AutoModelForSeq2SeqLM

    from hf_attn.modeling import BASES

    name = model_name(base, preset)
    model = AutoModelForSeq2SeqLM.from_pretrained(saved_directory(name, tmp_path))
    assert type(model) is BASES[base].model_class  # the newest code, not the saved copy
    assert compare(outputs(model), expected[name]) == "exact"


def write() -> None:
    """Save the fixture's models with the code of this checkout (run once, at commit 177819a)."""
    import filecmp
    import json
    import subprocess

    import transformers
    from saved_models import config_kwargs, outputs, perturb

    import hf_attn
    from hf_attn.modeling import BASES

    if FIXTURE.exists():
        raise SystemExit(f"{FIXTURE} exists: the fixture is written once and never rewritten")
    FIXTURE.mkdir(parents=True)
    recorded = {}
    for seed, (base, preset) in enumerate(MODELS):
        name = model_name(base, preset)
        torch.manual_seed(seed)
        b = BASES[base]
        model = b.model_class(b.config_class.from_preset(preset, **config_kwargs(base, preset)))
        perturb(model, seed)
        model.save_pretrained(FIXTURE / name)
        recorded[name] = outputs(model)
        (FIXTURE / "code").mkdir(exist_ok=True)
        for code in sorted((FIXTURE / name).glob("*.py")):  # the model code: the same in every directory
            kept = FIXTURE / "code" / code.name
            if kept.exists():
                assert filecmp.cmp(code, kept, shallow=False), code
            else:
                shutil.copy(code, kept)
            code.unlink()
    torch.save(recorded, FIXTURE / "outputs.pt")
    commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, cwd=FIXTURE).stdout.strip()
    (FIXTURE / "saved_with.json").write_text(json.dumps(
        {"commit": commit, "hf_attn": hf_attn.__version__, "transformers": transformers.__version__,
         "torch": torch.__version__}, indent=1) + "\n")
    print(f"wrote {FIXTURE}")


if __name__ == "__main__" and "--write" in sys.argv:
    write()
