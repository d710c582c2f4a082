"""The K/V cache (hf_attn/modeling/cache.py): `project_with_cache` builds the cache stock transformers builds."""

from __future__ import annotations

import pytest
import torch
from conftest import tiny_batch, tiny_model, vanilla_model

from hf_attn.modeling.cache import CACHE_KWARG  # ``cache`` since transformers 5.24, ``past_key_values`` before


@pytest.mark.parametrize("base", ["marian", "bart"])
@pytest.mark.parametrize("preset", ["softmax", "ran-d"])
def test_the_kv_cache_is_the_one_transformers_builds(base, preset):
    """`project_with_cache` mirrors BartAttention.forward's cache logic: after cached decoding steps, the self- and
    cross-attention caches hold exactly the stock model's keys and values (ran-d, without a key projection: the stock
    values, and zeros of the stock keys' shape in the key slot)."""
    from transformers.cache_utils import DynamicCache, EncoderDecoderCache

    vanilla = vanilla_model(base)
    ours = tiny_model(base, preset)
    ours.load_state_dict(vanilla.state_dict(), strict=False)
    b = tiny_batch()
    caches = {}
    for name, model in (("stock", vanilla), ("ours", ours)):
        cache = EncoderDecoderCache(DynamicCache(), DynamicCache())
        dec = torch.full((b["input_ids"].shape[0], 1), model.config.decoder_start_token_id)
        with torch.no_grad():
            for step in range(3):
                out = model(input_ids=b["input_ids"], attention_mask=b["attention_mask"], decoder_input_ids=dec,
                            use_cache=True, **{CACHE_KWARG: cache})
                cache = getattr(out, CACHE_KWARG)
                dec = out.logits[:, -1:].argmax(-1) if name == "stock" else caches["stock_tokens"][step]
                caches.setdefault(f"{name}_tokens", []).append(dec)
        caches[name] = cache
    stock, mine = caches["stock"], caches["ours"]
    assert mine.get_seq_length() == stock.get_seq_length() == 3
    # ran-d changes the decoder's hidden states after its first layer: compare that layer's values only
    for layer in range(ours.config.decoder_layers if preset == "softmax" else 1):
        for kind in ("self_attention_cache", "cross_attention_cache"):
            a, c = getattr(stock, kind).layers[layer], getattr(mine, kind).layers[layer]
            if preset == "softmax" or kind == "cross_attention_cache":
                torch.testing.assert_close(c.keys, a.keys)
            else:
                assert c.keys.shape == a.keys.shape and not c.keys.any()
            torch.testing.assert_close(c.values, a.values)
