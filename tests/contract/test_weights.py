"""Every preset, on Marian and on BART: the weights ``output_attentions`` returns at every site and layer are the
variant's own, recomputed by its paper's equation from the inputs the layer received (`reference`); and they
differ from softmax(q k^T / sqrt(dh)) where the variant's math says they must. A variant that returned softmax
weights fails both checks (the fault tests below substitute them)."""

from __future__ import annotations

import pytest
import torch
from conftest import EOS, PAD, tiny_batch
from conftest import cached_tiny_model as tiny_model  # (a copy of a session build: the faults patch after it)

import hf_attn
from hf_attn.modeling.attention_positional import positional_softmax
from hf_attn.modeling.kernels import softmax_attention
from hf_attn.modeling.registry import ATTENTION_VARIANTS

from .reference import check_family, check_weights

pytestmark = pytest.mark.usefixtures("one_thread")

BASES = ("marian", "bart")
CASES = [(b, p) for b in BASES for p in sorted(hf_attn.PRESETS)]
IDS = [f"{b}-{p}" for b, p in CASES]
# one preset per non-softmax variant, for the fault tests
FAULTY = {"rela": "rela-g", "sparsemax": "sparsemax", "entmax15": "entmax15", "reluformer": "reluformer",
          "gmm": "gmm", "calibrated": "calibration-gate", "recurrent": "ran-all", "hard-gaussian": "hard-gaussian",
          "synthesizer": "synthesizer"}


def other_tokens(batch: dict) -> dict:
    """The same padding, EOS positions and label lengths, other tokens."""
    new = tiny_batch(seed=7)
    ids = torch.where((batch["input_ids"] == EOS) | (batch["attention_mask"] == 0), batch["input_ids"], new["input_ids"])
    labels = torch.where(batch["labels"].lt(0) | batch["labels"].eq(EOS), batch["labels"], new["labels"])
    assert not torch.equal(ids, batch["input_ids"]) and ids.ne(PAD).sum() == batch["input_ids"].ne(PAD).sum()
    return {**batch, "input_ids": ids, "labels": labels}


@pytest.mark.parametrize("base,preset", CASES, ids=IDS)
def test_returned_weights_are_the_variants_equation(base, preset):
    model = tiny_model(base, preset)
    c = model.config
    assert check_weights(model, tiny_batch()) == c.encoder_layers + 2 * c.decoder_layers


@pytest.mark.parametrize("base,preset", CASES, ids=IDS)
def test_weights_differ_from_softmax_as_the_variant_requires(base, preset):
    b = tiny_batch()
    check_family(tiny_model(base, preset), b, other_tokens(b))


def substitute_softmax(monkeypatch, variant: str) -> None:
    """The fault: ``variant``'s attend keeps its output but returns softmax weights (uniform softmax over the visible
    keys for the position-only variants, which have no q and k)."""
    cls = ATTENTION_VARIANTS[variant]
    attend = cls.attend

    def faulty(self, q, k, v, keep, ctx):
        out, weights = attend(self, q, k, v, keep, ctx)
        if weights is None:
            return out, None
        if q is not None:
            return out, softmax_attention(q, k, v, keep, self.scaling, 0.0, True)[1]
        return out, positional_softmax(torch.zeros(1, keep.q_len, v.shape[2]), keep, v, 0.0, False, True)[1]

    monkeypatch.setattr(cls, "attend", faulty)


@pytest.mark.parametrize("variant", sorted(FAULTY))
def test_softmax_weights_in_place_of_a_variants_fail_the_equation_check(monkeypatch, variant):
    model = tiny_model("marian", FAULTY[variant])
    substitute_softmax(monkeypatch, variant)
    with pytest.raises(AssertionError, match=rf"\({variant}\)"):
        check_weights(model, tiny_batch())


@pytest.mark.parametrize("variant", sorted(v for v in FAULTY if ATTENTION_VARIANTS[v].uses_keys))
def test_softmax_weights_in_place_of_a_variants_fail_the_family_check(monkeypatch, variant):
    model = tiny_model("bart", FAULTY[variant])
    substitute_softmax(monkeypatch, variant)
    b = tiny_batch()
    with pytest.raises(AssertionError, match=rf"\({variant}\)"):
        check_family(model, b, other_tokens(b))
