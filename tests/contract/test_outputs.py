"""Every preset, on Marian and on BART: hidden states and attention maps in transformers' layout, asked for by
argument or through the config."""

from __future__ import annotations

import pytest
import torch
from conftest import cached_tiny_model as tiny_model  # (a copy of a session build: nothing here patches a build)
from conftest import tiny_batch

import hf_attn

pytestmark = pytest.mark.usefixtures("one_thread")

BASES = ("marian", "bart")
CASES = [(b, p) for b in BASES for p in sorted(hf_attn.PRESETS)]
IDS = [f"{b}-{p}" for b, p in CASES]


@pytest.mark.parametrize("base,preset", CASES, ids=IDS)
def test_hidden_states_and_attentions_by_argument_and_by_config(base, preset):
    """transformers' test_hidden_states_output / test_attention_outputs: one hidden state per layer plus the
    embeddings, one attention map per layer and site, in transformers' shapes. ``config.output_attentions = True``
    is allowed (transformers allows it only under "eager") and, with ``config.output_hidden_states``, gives the same
    tensors as the arguments."""
    model = tiny_model(base, preset)
    b = tiny_batch()
    dec = model.prepare_decoder_input_ids_from_labels(labels=b["labels"])
    inputs = dict(input_ids=b["input_ids"], attention_mask=b["attention_mask"], decoder_input_ids=dec)
    (batch, src_len), tgt_len = b["input_ids"].shape, dec.shape[1]
    with torch.no_grad():
        by_argument = model(**inputs, output_hidden_states=True, output_attentions=True)
        model.config.output_hidden_states = True
        model.config.output_attentions = True
        by_config = model(**inputs)
    d, h = model.config.d_model, model.config.encoder_attention_heads
    shapes = {
        "encoder_hidden_states": (model.config.encoder_layers + 1, (batch, src_len, d)),
        "decoder_hidden_states": (model.config.decoder_layers + 1, (batch, tgt_len, d)),
        "encoder_attentions": (model.config.encoder_layers, (batch, h, src_len, src_len)),
        "decoder_attentions": (model.config.decoder_layers, (batch, h, tgt_len, tgt_len)),
        "cross_attentions": (model.config.decoder_layers, (batch, h, tgt_len, src_len)),
    }
    for name, (count, shape) in shapes.items():
        got, want = getattr(by_config, name), getattr(by_argument, name)
        assert len(want) == count and all(tuple(t.shape) == shape for t in want), name
        assert len(got) == count and all(torch.equal(g, w) for g, w in zip(got, want)), name
