"""Every preset's logits on a fixed seed and batch are those recorded before the attention-contract refactor
(`tests/fixtures/preset_logits.pt`): training loss, teacher-forced logits and the auxiliary loss, Marian and BART.

Regenerate only for an intended change of the math: ``PYTHONPATH=tests python tests/modeling/test_logits_reference.py --write``."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from conftest import tiny_batch, tiny_model

import hf_attn
from hf_attn.modeling.compat import version_tuple

DATA = Path(__file__).resolve().parents[1] / "fixtures" / "preset_logits.pt"
# variant renamed since the recording; the recorded name is the key
RENAMED: dict[str, str] = {}
# defaults changed since the recording (a choice the papers leave open, settled by the recipe-sensitivity
# experiments in results/REPORT.md): the recording's values, so the comparison still checks the math
RECORDED_DEFAULTS = {"reluformer_reg_weight": 1.0, "gmm_gate_init": 0.5}
# the torch of the recording: RAN's training-mode loss draws its attention dropout (ran_attention_dropout 0.2), whose
# random masks differ between torch releases (torch 2.11: the RAN presets' train_loss moves by up to 3e-4, everything
# else agrees to 1e-7), so that one value is compared on the recording's torch only
RECORDED_TORCH = (2, 13)


def preset_variants(preset: str) -> set[str]:
    """The variants a preset runs at some site (a hyperparameter of another variant is refused by from_preset)."""
    out = set()
    for key, value in hf_attn.PRESETS[preset].overrides.items():
        if key.endswith("_attention"):
            out.update(value if isinstance(value, list) else [value])
    return out


def preset_outputs(base: str, preset: str) -> dict:
    """Eval logits and loss; training-mode loss and auxiliary loss (dropout is 0); beam-2 cached generation."""
    model = tiny_model(base, preset, seed=0, **{k: v for k, v in RECORDED_DEFAULTS.items()
                                                 if k not in hf_attn.PRESETS[preset].overrides
                                                 and k.split("_")[0] in preset_variants(preset)})
    b = tiny_batch(batch=4, src_len=9, tgt_len=7, seed=3)
    with torch.no_grad():
        out = model.eval()(**b)
        model.train()
        train = model(**b)
        model.eval()
        seq = model.generate(input_ids=b["input_ids"], attention_mask=b["attention_mask"], num_beams=2, max_length=8,
                             do_sample=False)
    aux = train.aux_loss if train.aux_loss is not None else torch.zeros(())
    return {"logits": out.logits.float(), "loss": out.loss.float(), "train_loss": train.loss.float(),
            "aux_loss": aux.float(), "generated": seq}


def record() -> dict:
    return {f"{b}/{p}": preset_outputs(b, p) for b in ("marian", "bart") for p in sorted(hf_attn.PRESETS)}


@pytest.mark.parametrize("base", ["marian", "bart"])
def test_logits_match_the_recording(base):
    ref = torch.load(DATA)
    for key, want in ref.items():
        b, preset = key.split("/")
        if b != base:
            continue
        got = preset_outputs(b, RENAMED.get(preset, preset))
        random_dropout = "recurrent" in preset_variants(RENAMED.get(preset, preset))
        for name in want:
            if name == "train_loss" and random_dropout and version_tuple(torch.__version__)[:2] != RECORDED_TORCH:
                continue
            if name == "generated":
                assert torch.equal(got[name], want[name]), f"{key} {name}"
            else:
                torch.testing.assert_close(got[name], want[name], rtol=1e-5, atol=1e-6, msg=f"{key} {name}")


if __name__ == "__main__" and "--write" in sys.argv:
    DATA.parent.mkdir(exist_ok=True)
    torch.save(record(), DATA)
    print(f"wrote {DATA}")
