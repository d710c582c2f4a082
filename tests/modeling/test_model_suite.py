"""transformers' common model and generation tests (ModelTesterMixin / GenerationTesterMixin), as focused
equivalents for hf-attn models, on Marian and BART.

What they check of a seq2seq LM: outputs with ``return_dict`` True == False (the loss, with the auxiliary loss,
first), and stock's fields in pure inference (hidden states and attentions by argument and by config: tests/contract/); gradients
reaching retained hidden states and attention weights; ``attn_implementation`` requests ("eager" everywhere,
"sdpa" where every site is softmax, the rest one clear line; never a switch away from hf-attn's own
implementation); ``GenerationMixin`` among the model classes' bases; train-mode forwards without labels (an error
only when backpropagated, where a variant's objective would be lost); gradient checkpointing (same loss and
gradients); resizing the embeddings; save / load through the model class and the Auto classes; the encoder and
decoder run on their own (the stock classes drop a variant's weights); the cache in transformers' standard format (`EncoderDecoderCache`, ``[B, H, T,
dh]`` per layer), made by the model or by the caller, continued step by step; static caches; greedy, sampling,
beam, beam-sample, ``num_return_sequences``, ``max_new_tokens``, assisted and prompt-lookup decoding, generation
continued from a returned cache; stock's default generation length.

The cheap checks run on every preset; the others on one preset per variant plus the presets with decoding paths
of their own. Where a variant cannot pass a check, the test checks the paper's reason instead (docs/python.md, "What the
variants do not support").
"""

from __future__ import annotations

import copy

import pytest
import torch
from conftest import BASE_DEFAULTS, EOS, TINY, VOCAB, tiny_batch, tiny_config
from conftest import cached_tiny_model as tiny_model  # (a copy of a session build: nothing here patches a build)
from transformers import (
    AutoConfig,
    AutoModel,
    AutoModelForSeq2SeqLM,
    BartConfig,
    BartForConditionalGeneration,
    GenerationMixin,
    MarianConfig,
    MarianMTModel,
)
from transformers.cache_utils import DynamicCache, EncoderDecoderCache
from transformers.models.bart.modeling_bart import BartDecoder, BartEncoder
from transformers.models.marian.modeling_marian import MarianDecoder, MarianEncoder

import hf_attn
from hf_attn.modeling.cache import CACHE_KWARG, HfAttnCache  # ("cache" from transformers 5.24, past_key_values before)
from hf_attn.modeling.compat import TRANSFORMERS_VERSION
from hf_attn.modeling.hyperparameters import HfAttnConfigError

pytestmark = pytest.mark.usefixtures("one_thread")  # tiny models: one thread is faster and steadier

BASES = ("marian", "bart")
STOCK = {name: (b.stock_config_class, b.stock_model_class) for name, b in hf_attn.modeling.BASES.items()}
STOCK_PARTS = {"marian": (MarianEncoder, MarianDecoder), "bart": (BartEncoder, BartDecoder)}
# weights that are a fixed function of positions: no gradient reaches them (You et al. 2020: nothing is learned)
FIXED_WEIGHTS = {"hard-gaussian"}


def one_preset_per_variant() -> list[str]:
    """For every variant, the first preset that uses it at the most attention sites."""
    best: dict[str, tuple[int, str]] = {}
    for name in hf_attn.PRESETS:
        layout = tiny_config("marian", name).attention_layout()
        for variant in {v for layers in layout.values() for v in layers}:
            sites = sum(variant in layers for layers in layout.values())
            if sites > best.get(variant, (0, ""))[0]:
                best[variant] = (sites, name)
    return [name for _, name in best.values()]


# + decoding paths of their own: GMM's synthesis state in the cache, the gate and anneal fusions, cross-site positions
REPRESENTATIVES = sorted(set(one_preset_per_variant()) | {"gmm-synthesis", "calibration-gate", "hard-gaussian-cross"})
ALL = [(b, p) for b in BASES for p in sorted(hf_attn.PRESETS)]
SOME = [(b, p) for b in BASES for p in REPRESENTATIVES]


def ids(cases):
    return [f"{b}-{p}" for b, p in cases]


def src_of(b: dict) -> dict:
    return {"input_ids": b["input_ids"], "attention_mask": b["attention_mask"]}


def assert_same(got, want, path="output"):
    """Nested tuples / dicts of tensors (or None) are identical."""
    if isinstance(want, torch.Tensor):
        assert isinstance(got, torch.Tensor) and torch.equal(got, want), path
    elif isinstance(want, (tuple, list)):
        assert isinstance(got, (tuple, list)) and len(got) == len(want), path
        for i, (g, w) in enumerate(zip(got, want)):
            assert_same(g, w, f"{path}[{i}]")
    elif isinstance(want, dict):
        assert isinstance(got, dict) and got.keys() == want.keys(), path
        for k in want:
            assert_same(got[k], want[k], f"{path}[{k!r}]")
    else:
        assert got == want, path


_STOCK_BUILT: dict = {}


def stock_model(base):
    """The stock model of the tiny sizes (its outputs are what hf-attn's must look like): a copy of one build per
    base (its random weights are never compared, only its outputs' fields)."""
    if base not in _STOCK_BUILT:
        config_cls, model_cls = STOCK[base]
        _STOCK_BUILT[base] = model_cls(config_cls(**{**TINY, **BASE_DEFAULTS[base]}, attn_implementation="eager")).eval()
    return copy.deepcopy(_STOCK_BUILT[base])


def training_model(base, preset, **overrides):
    model = tiny_model(base, preset, **overrides).train()
    model.set_training_step(0)  # what a training loop does (step-driven schedules need it)
    return model


# ---- outputs (every preset) ------------------------------------------------------------------------------------
@pytest.mark.parametrize("base,preset", ALL, ids=ids(ALL))
def test_return_dict_false_gives_the_same_outputs(base, preset):
    """test_model_outputs_equivalence: the tuple is the dict's ``to_tuple()``, in training (the loss that leads
    includes the auxiliary loss) and with hidden states and attentions."""
    model = training_model(base, preset)
    b = tiny_batch()
    kw = dict(output_hidden_states=True, output_attentions=True)
    torch.manual_seed(0)
    as_dict = model(**b, **kw)
    torch.manual_seed(0)
    as_tuple = model(**b, **kw, return_dict=False)
    assert isinstance(as_tuple, tuple)
    assert_same(as_tuple, as_dict.to_tuple())
    if any(cls.training_objective(model.config) for cls in model.variant_classes()):
        assert as_dict.aux_loss is not None and as_tuple[0] is not None


@pytest.mark.parametrize("base,preset", ALL, ids=ids(ALL))
def test_pure_inference_returns_stock_fields(base, preset):
    """test_attention_outputs counts the output's fields: a pure inference call (eval mode, no labels, no
    autograd) returns exactly stock's fields, as a dict and as a ``return_dict=False`` tuple (ReLUFormer's
    regulariser is not computed there); with labels, the auxiliary terms come after stock's fields."""
    model, stock = tiny_model(base, preset), stock_model(base)
    b = tiny_batch()
    dec = model.prepare_decoder_input_ids_from_labels(labels=b["labels"])
    for kw in (dict(), dict(output_hidden_states=True, output_attentions=True)):
        inputs = dict(src_of(b), decoder_input_ids=dec, **kw)
        with torch.no_grad():
            ours, want = model(**inputs), stock(**inputs)
            as_tuple = model(**inputs, return_dict=False)
        assert list(ours.keys()) == list(want.keys()), kw
        assert len(as_tuple) == len(want.to_tuple()), kw
    with torch.no_grad():
        scored, want = model(**b), stock(**b)
    assert list(scored.keys())[: len(want)] == list(want.keys())
    assert list(scored.keys())[len(want):] in ([], ["aux_logs"], ["aux_loss", "aux_logs"])


@pytest.mark.parametrize("base,preset", ALL, ids=ids(ALL))
def test_gradients_reach_retained_hidden_states_and_attentions(base, preset):
    """test_retain_grad_hidden_states_attentions, in training; fixed weights (hard-coded Gaussian) carry none."""
    model = training_model(base, preset)
    out = model(**tiny_batch(), output_hidden_states=True, output_attentions=True)
    layout = model.config.attention_layout()
    retained = [out.encoder_hidden_states[0], out.decoder_hidden_states[0]]
    for site, weights in (("encoder", out.encoder_attentions), ("decoder", out.decoder_attentions),
                          ("cross", out.cross_attentions)):
        if layout[site][0] in FIXED_WEIGHTS:
            assert not weights[0].requires_grad, site  # a function of positions only: nothing upstream to train
        else:
            retained.append(weights[0])
    for t in retained:
        t.retain_grad()
    out.loss.backward()
    for i, t in enumerate(retained):
        assert t.grad is not None, i


# ---- attention implementation ------------------------------------------------------------------------------------
def requested_as_config(base, preset, name):
    """A model built from a config that asks for ``name`` (what from_pretrained(..., attn_implementation=) does)."""
    config = tiny_config(base, preset)
    config._attn_implementation = name
    cls = hf_attn.HfAttnMarianMTModel if base == "marian" else hf_attn.HfAttnBartForConditionalGeneration
    torch.manual_seed(0)  # the weights of tiny_model(base, preset)
    return cls(config).eval()


@pytest.mark.parametrize("base,preset", ALL, ids=ids(ALL))
def test_eager_is_each_variants_own_attention(base, preset):
    """test_attention_outputs / test_retain_grad_hidden_states_attentions / the generation tests ask for "eager" to
    get attention weights: accepted by the config path and by set_attn_implementation alike, remembered, and the
    model keeps running hf-attn's own implementation (identical outputs, weights returned)."""
    default = tiny_model(base, preset)
    by_config = requested_as_config(base, preset, "eager")
    by_method = tiny_model(base, preset)
    by_method.set_attn_implementation("eager")
    b = tiny_batch()
    dec = default.prepare_decoder_input_ids_from_labels(labels=b["labels"])
    inputs = dict(src_of(b), decoder_input_ids=dec, output_attentions=True)
    with torch.no_grad():
        want = default(**inputs)
        for model in (by_config, by_method):
            assert model.config._attn_implementation == "hf_attn"
            assert model.requested_attn_implementation == "eager"
            got = model(**inputs)
            assert_same(got.logits, want.logits)
            assert len(got.cross_attentions) == model.config.decoder_layers
            assert all(a is not None for a in got.encoder_attentions + got.decoder_attentions + got.cross_attentions)


@pytest.mark.parametrize("base", BASES)
def test_sdpa_only_where_every_site_is_softmax_and_no_other_kernel(base, tmp_path):
    """"sdpa" is honoured where every site is softmax (whose attention is torch's SDPA kernel); a variant without
    one, flash attention, flex attention or an unknown name is one clear line naming the value and the fix, by
    every path. Switching to transformers' implementations stays advertised as unsupported."""
    softmax, rela = tiny_model(base, "softmax"), tiny_model(base, "rela-g")
    cls = type(softmax)
    assert not cls._can_set_attn_implementation()
    assert not (cls._supports_sdpa or cls._supports_flash_attn or cls._supports_flex_attn)
    b = src_of(tiny_batch())
    with torch.no_grad():
        want = softmax(**b, decoder_input_ids=b["input_ids"]).logits
        sdpa = requested_as_config(base, "softmax", "sdpa")
        assert sdpa.config._attn_implementation == "hf_attn" and sdpa.requested_attn_implementation == "sdpa"
        assert_same(sdpa(**b, decoder_input_ids=b["input_ids"]).logits, want)
    softmax.set_attn_implementation("sdpa")
    assert softmax.requested_attn_implementation == "sdpa" and softmax.config._attn_implementation == "hf_attn"
    sdpa_refusal = r"attn_implementation='sdpa' is not available for this model: its \['rela'\] attention has no SDPA"
    with pytest.raises(HfAttnConfigError, match=sdpa_refusal + r".*use attn_implementation='eager'"):
        rela.set_attn_implementation("sdpa")
    with pytest.raises(HfAttnConfigError, match=sdpa_refusal):  # one site is enough
        tiny_model(base, "softmax", cross_attention="rela").set_attn_implementation({"": "sdpa"})
    for name in ("flash_attention_2", "flash_attention_3", "flex_attention", "paged|eager", "no-such-kernel"):
        for model in (softmax, rela):
            with pytest.raises(HfAttnConfigError, match=rf"attn_implementation='{name}' is not available"):
                model.set_attn_implementation(name)
    assert rela.requested_attn_implementation is None and rela.config._attn_implementation == "hf_attn"
    rela.set_attn_implementation("hf_attn")  # what it runs: accepted
    for model in (softmax, rela):
        model.save_pretrained(tmp_path / model.config.preset)
    with pytest.raises(HfAttnConfigError, match=sdpa_refusal):
        cls.from_pretrained(tmp_path / "rela-g", attn_implementation="sdpa")
    with pytest.raises(HfAttnConfigError, match="attn_implementation='flash_attention_2' is not available"):
        AutoModelForSeq2SeqLM.from_pretrained(tmp_path / "softmax", attn_implementation="flash_attention_2")
    with pytest.raises(HfAttnConfigError, match="attn_implementation='flex_attention' is not available"):
        AutoModelForSeq2SeqLM.from_config(rela.config, attn_implementation="flex_attention")
    for preset, name in (("softmax", "sdpa"), ("rela-g", "eager"), ("rela-g", "hf_attn"), ("rela-g", None)):
        kw = {} if name is None else {"attn_implementation": name}
        for loaded in (cls.from_pretrained(tmp_path / preset, **kw),
                       AutoModelForSeq2SeqLM.from_pretrained(tmp_path / preset, **kw)):
            assert loaded.config._attn_implementation == "hf_attn" and loaded.requested_attn_implementation == name


@pytest.mark.parametrize("base", BASES)
def test_model_classes_inherit_generation_mixin(base):
    """test_inherits_generation_mixin: GenerationMixin is a direct base, as transformers 5 expects of every model
    that generates."""
    cls = type(tiny_model(base))
    assert GenerationMixin in cls.__bases__ and issubclass(cls, GenerationMixin)
    assert cls.can_generate()


# ---- training without labels (every preset) ----------------------------------------------------------------------
@pytest.mark.parametrize("base,preset", ALL, ids=ids(ALL))
def test_a_training_forward_without_labels_fails_only_when_backpropagated(base, preset):
    """A freshly built model is in train mode: running it without labels (inference, resize_token_embeddings
    checks) is fine. Backpropagating a loss computed outside the model from such a forward (transformers'
    trainer under label smoothing) would lose a variant's objective or leave a step-driven schedule standing
    still: that backward is one clear error."""
    model = tiny_model(base, preset).train()
    b = tiny_batch()
    dec = model.prepare_decoder_input_ids_from_labels(labels=b["labels"])
    out = model(**src_of(b), decoder_input_ids=dec)  # no labels, gradients on, set_training_step never called
    assert out.loss is None and torch.isfinite(out.logits).all()
    config = model.config
    if any(cls.training_objective(config) for cls in model.variant_classes()):
        expected = "needs `labels` in every training forward"
    elif any(cls.needs_training_step(config) for cls in model.variant_classes()):
        expected = "set_training_step was never called"
    else:
        expected = None
    if expected is None:
        out.logits.sum().backward()  # nothing to lose: an ordinary backward
    else:
        with pytest.raises(HfAttnConfigError, match=expected):
            out.logits.sum().backward()
        model.set_training_step(0)
        with_labels = model(**b)  # the real training step: labels and the step given
        with_labels.loss.backward()


# ---- training-side features (one preset per variant) -------------------------------------------------------------
@pytest.mark.parametrize("base,preset", SOME, ids=ids(SOME))
def test_gradient_checkpointing_gives_the_same_loss_and_gradients(base, preset):
    """test_training_gradient_checkpointing, plus equality: checkpointed layers recompute exactly what they ran
    (attention calibration's perturbed pass included)."""
    grads, losses = [], []
    for checkpointing in (False, True):
        model = training_model(base, preset, dropout=0.1, attention_dropout=0.1)
        if checkpointing:
            getattr(model, "activation_checkpointing_enable", model.gradient_checkpointing_enable)()  # (5.24 name)
        torch.manual_seed(0)
        out = model(**tiny_batch())
        out.loss.backward()
        losses.append(out.loss.detach())
        grads.append({n: p.grad for n, p in model.named_parameters() if p.requires_grad})
    torch.testing.assert_close(losses[1], losses[0])
    assert grads[1].keys() == grads[0].keys()
    for name, g in grads[0].items():
        assert g is not None and grads[1][name] is not None, name
        torch.testing.assert_close(grads[1][name], g, rtol=1e-4, atol=1e-6, msg=name)


@pytest.mark.parametrize("base,preset", SOME, ids=ids(SOME))
def test_resize_token_embeddings(base, preset):
    """test_resize_tokens_embeddings: larger or smaller, the kept rows are unchanged, a freshly built (train-mode)
    model runs without labels, and training runs (each from a fresh model: in stock transformers 5.24 too, a
    backward after growing then shrinking fails)."""
    before = training_model(base, preset).get_input_embeddings().weight.detach().clone()
    for size in (VOCAB + 8, VOCAB - 8):
        fresh = tiny_model(base, preset).train()  # as built: no set_training_step, no labels
        fresh.resize_token_embeddings(size)
        ids = tiny_batch()["input_ids"].clamp(max=size - 1)
        assert fresh(input_ids=ids, decoder_input_ids=ids).logits.shape[-1] == size
        model = training_model(base, preset)
        model.resize_token_embeddings(size)
        assert model.config.vocab_size == size
        assert model.get_input_embeddings().weight.shape[0] == model.get_output_embeddings().weight.shape[0] == size
        keep = min(size, VOCAB)
        torch.testing.assert_close(model.get_input_embeddings().weight[:keep], before[:keep])
        b = tiny_batch()
        b = {k: v.clamp(max=size - 1) for k, v in b.items()}
        out = model(**b)
        assert out.logits.shape[-1] == size and torch.isfinite(out.loss)
        out.loss.backward()


@pytest.mark.parametrize("base,preset", SOME, ids=ids(SOME))
def test_save_and_load_through_the_class_and_the_auto_classes(base, preset, tmp_path):
    """test_save_load: every weight comes back (no missing or unexpected key) and the outputs are identical;
    after ``import hf_attn`` the Auto classes load it without trust_remote_code."""
    model = tiny_model(base, preset)
    b = tiny_batch()
    with torch.no_grad():
        want = model(**b).logits
    model.save_pretrained(tmp_path)
    again, info = type(model).from_pretrained(tmp_path, output_loading_info=True)
    assert not any(info.values()), info
    assert isinstance(AutoConfig.from_pretrained(tmp_path), type(model.config))
    auto = AutoModelForSeq2SeqLM.from_pretrained(tmp_path)
    assert type(auto) is type(model)
    with torch.no_grad():
        for loaded in (again, auto):
            torch.testing.assert_close(loaded.eval()(**b).logits, want, rtol=0, atol=0)


@pytest.mark.parametrize("base", BASES)
def test_what_stock_classes_load(base, tmp_path):
    """A softmax-preset checkpoint is a stock checkpoint (the stock class gives identical outputs); a variant's own
    weights have no place in the stock class, and there is no bare encoder-decoder class for AutoModel."""
    b = tiny_batch()
    for preset in ("softmax", "rela-g"):
        model = tiny_model(base, preset)
        model.save_pretrained(tmp_path / preset)
        stock, info = STOCK[base][1].from_pretrained(tmp_path / preset, output_loading_info=True)
        assert not info["missing_keys"]
        if preset == "softmax":
            assert not info["unexpected_keys"]
            with torch.no_grad():
                torch.testing.assert_close(stock.eval()(**b).logits, model(**b).logits, rtol=0, atol=0)
        else:
            assert info["unexpected_keys"] and all("rela" in k for k in info["unexpected_keys"])
    with pytest.raises(ValueError, match="Unrecognized configuration class"):
        AutoModel.from_pretrained(tmp_path / "softmax")


@pytest.mark.parametrize("base,preset", ALL, ids=ids(ALL))
def test_encoder_and_decoder_run_on_their_own(base, preset, tmp_path):
    """test_encoder_decoder_model_standalone: the encoder and decoder of an hf-attn model (``get_encoder()`` /
    ``get_decoder()``) give the full model's states on their own. Saved alone and loaded into the stock
    MarianEncoder / BartDecoder (...) classes they lose a variant's weights, which transformers' loading report
    lists as unexpected: there is no hf-attn encoder or decoder class (docs/python.md, "What works with transformers")."""
    model = tiny_model(base, preset)
    b = tiny_batch()
    dec = model.prepare_decoder_input_ids_from_labels(labels=b["labels"])
    with torch.no_grad():
        full = model.model(**src_of(b), decoder_input_ids=dec)
        encoded = model.get_encoder()(**src_of(b)).last_hidden_state
        decoded = model.get_decoder()(input_ids=dec, encoder_hidden_states=full.encoder_last_hidden_state,
                                      encoder_attention_mask=b["attention_mask"]).last_hidden_state
    assert_same(encoded, full.encoder_last_hidden_state)
    assert_same(decoded, full.last_hidden_state)
    layout = model.config.attention_layout()
    for part, stock_cls, sites in ((model.get_encoder(), STOCK_PARTS[base][0], ("encoder",)),
                                   (model.get_decoder(), STOCK_PARTS[base][1], ("decoder", "cross"))):
        own = set(part.state_dict())
        stock_keys = set(stock_cls(copy.deepcopy(part.config)).state_dict())
        if all(v == "softmax" for site in sites for v in layout[site]):
            assert own <= stock_keys  # nothing of a variant's own: the stock class holds it all
        elif not own <= stock_keys:
            path = tmp_path / type(part).__name__
            part.save_pretrained(path)
            _, info = stock_cls.from_pretrained(path, output_loading_info=True)
            assert info["unexpected_keys"] == own - stock_keys


# ---- the cache -------------------------------------------------------------------------------------------------
def check_standard_format(cache, model, batch: int, tgt_len: int, src_len: int):
    """transformers' cache format: an EncoderDecoderCache whose layers hold keys and values [B, H, T|S, dh]."""
    assert isinstance(cache, HfAttnCache) and isinstance(cache, EncoderDecoderCache)
    assert cache.get_seq_length() == tgt_len
    h = model.config.decoder_attention_heads
    dh = model.config.d_model // h
    for i in range(model.config.decoder_layers):
        for sub, length in ((cache.self_attention_cache, tgt_len), (cache.cross_attention_cache, src_len)):
            layer = sub.layers[i]
            assert tuple(layer.keys.shape) == tuple(layer.values.shape) == (batch, h, length, dh), i


@pytest.mark.parametrize("base,preset", SOME, ids=ids(SOME))
def test_cached_decoding_step_by_step_matches_the_full_forward(base, preset):
    """test_past_key_values_format + decoding with a cache: the model's own cache (use_cache=True) and a caller's
    EncoderDecoderCache, fed one token at a time, give the full forward's logits; the cache has the standard
    format (the position-only variants keep zeros in the key slot)."""
    model = tiny_model(base, preset)
    b = tiny_batch()
    dec = model.prepare_decoder_input_ids_from_labels(labels=b["labels"])
    (batch, src_len), tgt_len = b["input_ids"].shape, dec.shape[1]
    with torch.no_grad():
        full = model(**src_of(b), decoder_input_ids=dec).logits
        for first_cache in (None, EncoderDecoderCache(DynamicCache(), DynamicCache())):
            out = model(**src_of(b), decoder_input_ids=dec[:, :1], use_cache=True, **{CACHE_KWARG: first_cache})
            steps, enc = [out.logits], (out.encoder_last_hidden_state,)
            for t in range(1, tgt_len):
                cache = {CACHE_KWARG: getattr(out, CACHE_KWARG)}
                out = model(encoder_outputs=enc, attention_mask=b["attention_mask"], decoder_input_ids=dec[:, t : t + 1],
                            use_cache=True, **cache)
                steps.append(out.logits)
            torch.testing.assert_close(torch.cat(steps, dim=1), full, rtol=1e-4, atol=1e-5)
            check_standard_format(getattr(out, CACHE_KWARG), model, batch, tgt_len, src_len)


@pytest.mark.parametrize("base,preset", SOME, ids=ids(SOME))
def test_static_cache_decodes_like_the_dynamic_cache(base, preset):
    """test_generate_with_static_cache: greedy and beam search with cache_implementation="static" give the
    dynamic cache's tokens and scores (the query offset comes from the cache's length, not its size)."""
    model = tiny_model(base, preset)
    src = src_of(tiny_batch())
    kw = dict(max_new_tokens=7, min_new_tokens=7, output_scores=True, return_dict_in_generate=True)
    for extra in (dict(do_sample=False), dict(num_beams=2, do_sample=False)):
        dynamic = model.generate(**src, **kw, **extra)
        static = model.generate(**src, **kw, **extra, cache_implementation="static")
        assert torch.equal(static.sequences, dynamic.sequences), extra
        for s, d in zip(static.scores, dynamic.scores):
            torch.testing.assert_close(s.clamp(min=-1e4), d.clamp(min=-1e4), rtol=1e-4, atol=1e-5)


def filled_cache(rows: list[int], batch: int = 4, length: int = 3) -> HfAttnCache:
    """An HfAttnCache of one layer: self-attention row i holds i, cross-attention row i holds ``rows[i]``."""
    cache = HfAttnCache(DynamicCache(), DynamicCache())
    own = torch.arange(float(batch)).view(batch, 1, 1, 1).expand(batch, 2, length, 4)
    source = torch.tensor(rows, dtype=torch.float).view(batch, 1, 1, 1).expand(batch, 2, length + 2, 4)
    cache.self_attention_cache.update(own.clone(), own.clone() + 10, 0)
    cache.cross_attention_cache.update(source.clone(), source.clone() + 10, 0)
    return cache


def test_beam_reordering_moves_the_cross_attention_cache_only_between_different_rows():
    """Beam search reorders within a sentence's rows, whose cross-attention keys and values are equal: those stay as
    they are (no copy); a reordering onto different rows copies them, as EncoderDecoderCache does."""
    cache = filled_cache([7, 7, 5, 5])  # two sentences, two beams each
    cross = cache.cross_attention_cache.layers[0]
    keys, values = cross.keys, cross.values
    cache.reorder_cache(torch.tensor([1, 1, 2, 2]))
    assert cross.keys is keys and cross.values is values
    assert cache.self_attention_cache.layers[0].keys[:, 0, 0, 0].tolist() == [1, 1, 2, 2]  # hypotheses do move
    cache.reorder_cache(torch.tensor([2, 3, 0, 1]))  # across sentences: copied
    assert cross.keys[:, 0, 0, 0].tolist() == [5, 5, 7, 7] and cross.values[:, 0, 0, 0].tolist() == [15, 15, 17, 17]
    cache = filled_cache([7, 7, 5, 5])
    cache.cross_attention_cache.layers[0].values[1, 0, 0, 0] = -1  # keys equal, values not: copied
    cache.reorder_cache(torch.tensor([1, 1, 2, 2]))
    assert cache.cross_attention_cache.layers[0].values[:, 0, 0, 0].tolist() == [-1, -1, 15, 15]
    cache = filled_cache([7, 7, 5, 5])  # source-side state follows the same rule; state over targets always moves
    cache.set_state("source", torch.tensor([7.0, 7.0, 5.0, 5.0]))
    cache.set_state("target", torch.arange(4.0).view(4, 1), target_dim=1)
    source = cache.get_state("source")
    cache.reorder_cache(torch.tensor([1, 1, 2, 2]))
    assert cache.get_state("source") is source and cache.get_state("target").flatten().tolist() == [1, 1, 2, 2]
    cache.set_state("source", torch.tensor([7.0, 6.0, 5.0, 5.0]))  # keys equal, source state not: both copied
    cache.reorder_cache(torch.tensor([1, 1, 2, 2]))
    assert cache.get_state("source").tolist() == [6, 6, 5, 5]
    assert cache.cross_attention_cache.layers[0].keys is not keys
    cache = filled_cache([7, 5, 7, 5])  # equal rows that are not neighbours: copied (same values either way)
    cache.reorder_cache(torch.tensor([2, 1, 0, 3]))
    assert cache.cross_attention_cache.layers[0].keys[:, 0, 0, 0].tolist() == [7, 5, 7, 5]


COPY_CASES = [("marian", "softmax"), ("bart", "gmm-synthesis"), ("marian", "calibration-gate")]


@pytest.mark.parametrize("base,preset", COPY_CASES, ids=ids(COPY_CASES))
def test_beam_search_is_the_same_without_copying_the_cross_attention_cache(base, preset, monkeypatch):
    model = tiny_model(base, preset)
    src = src_of(tiny_batch())
    kw = {"max_new_tokens": 7, "min_new_tokens": 7, "num_beams": 3, "output_scores": True,
          "return_dict_in_generate": True}
    skipped = []
    keeps = HfAttnCache._keeps_source_rows
    monkeypatch.setattr(HfAttnCache, "_keeps_source_rows", lambda self, idx: skipped.append(keeps(self, idx)) or
                        skipped[-1])
    fast = model.generate(**src, **kw)
    assert skipped and all(skipped)  # every step left the cross-attention cache in place
    monkeypatch.setattr(HfAttnCache, "_keeps_source_rows", lambda self, idx: False)
    copied = model.generate(**src, **kw)
    assert torch.equal(fast.sequences, copied.sequences)
    assert torch.equal(fast.sequences_scores, copied.sequences_scores)


# ---- generation ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("base,preset", SOME, ids=ids(SOME))
def test_generation_modes(base, preset):
    """test_greedy_generate / test_sample_generate / test_beam_search_generate / test_beam_sample_generate with
    num_return_sequences and max_new_tokens; sampling draws the same tokens with and without the cache."""
    model = tiny_model(base, preset)
    src = src_of(tiny_batch())
    n, new = src["input_ids"].shape[0], dict(max_new_tokens=6, min_new_tokens=6)
    assert model.generate(**src, **new, do_sample=False).shape == (n, 7)
    sampled = []
    for use_cache in (True, False):
        torch.manual_seed(0)
        sampled.append(model.generate(**src, **new, do_sample=True, top_k=0, use_cache=use_cache))
    assert torch.equal(sampled[0], sampled[1])
    beams = model.generate(**src, **new, num_beams=3, num_return_sequences=2, output_scores=True,
                           return_dict_in_generate=True)
    assert beams.sequences.shape == (2 * n, 7)
    assert (beams.sequences_scores.view(n, 2).diff(dim=1) <= 1e-6).all()  # best first
    torch.manual_seed(0)
    assert model.generate(**src, **new, do_sample=True, num_beams=2, num_return_sequences=2).shape == (2 * n, 7)


@pytest.mark.parametrize("base,preset", SOME, ids=ids(SOME))
def test_generate_dict_outputs(base, preset):
    """test_greedy_generate_dict_outputs / test_beam_search_generate_dict_outputs (with ``output_attentions``,
    ``output_hidden_states``, ``output_scores`` and ``output_logits``): one entry per new token, stock's shapes
    (the cache makes each step's query one token long), and each step's weights are the variant's own: the rows
    of a teacher-forced forward over the generated tokens."""
    model = tiny_model(base, preset)
    src = src_of(tiny_batch())
    n, s, new = src["input_ids"].shape[0], src["input_ids"].shape[1], 6
    heads, layers = TINY["decoder_attention_heads"], TINY["decoder_layers"]
    kw = dict(max_new_tokens=new, min_new_tokens=new, output_attentions=True, output_hidden_states=True,
              output_scores=True, return_dict_in_generate=True)
    greedy = model.generate(**src, **kw, do_sample=False, output_logits=True)
    assert len(greedy.scores) == len(greedy.logits) == len(greedy.decoder_attentions) == new
    assert all(x.shape == (n, VOCAB) for x in greedy.scores + greedy.logits)
    assert len(greedy.encoder_attentions) == TINY["encoder_layers"]
    assert all(a.shape == (n, TINY["encoder_attention_heads"], s, s) for a in greedy.encoder_attentions)
    assert len(greedy.encoder_hidden_states) == TINY["encoder_layers"] + 1
    for t in range(new):
        assert len(greedy.decoder_attentions[t]) == len(greedy.cross_attentions[t]) == layers
        assert all(a.shape == (n, heads, 1, t + 1) for a in greedy.decoder_attentions[t])
        assert all(a.shape == (n, heads, 1, s) for a in greedy.cross_attentions[t])
        assert len(greedy.decoder_hidden_states[t]) == layers + 1
    forced = model(**src, decoder_input_ids=greedy.sequences[:, :-1], output_attentions=True)
    for layer in range(layers):
        steps = torch.cat([greedy.cross_attentions[t][layer] for t in range(new)], dim=2)
        torch.testing.assert_close(steps, forced.cross_attentions[layer], atol=1e-5, rtol=1e-4)
        last = greedy.decoder_attentions[new - 1][layer][:, :, 0]
        torch.testing.assert_close(last, forced.decoder_attentions[layer][:, :, -1], atol=1e-5, rtol=1e-4)
    beams = model.generate(**src, **kw, num_beams=2, do_sample=False)
    assert len(beams.scores) == len(beams.decoder_attentions) == new and beams.sequences.shape == (n, new + 1)
    assert all(a.shape == (2 * n, heads, 1, s) for step in beams.cross_attentions for a in step)
    assert beams.beam_indices.shape[0] == n


@pytest.mark.parametrize("base,preset", SOME, ids=ids(SOME))
def test_assisted_decoding_and_continuing_from_a_cache_match_greedy(base, preset):
    """test_assisted_decoding_matches_greedy_search / test_prompt_lookup_decoding_matches_greedy_search (rejected
    drafts crop the cache and the variants' decoding state) / test_generate_continue_from_past_key_values."""
    model = tiny_model(base, preset)
    src = src_of(tiny_batch(batch=1))
    kw = dict(do_sample=False, max_new_tokens=8, min_new_tokens=8)
    greedy = model.generate(**src, **kw)
    assistant = tiny_model(base, preset, seed=1)  # another model: some drafts are rejected
    assert torch.equal(model.generate(**src, **kw, assistant_model=assistant), greedy)
    if not (base == "bart" and TRANSFORMERS_VERSION < (5, 18)):
        # (transformers 5.17's prompt lookup decoding stops stock BartForConditionalGeneration after its first token
        # too; 5.18 decodes the greedy tokens)
        assert torch.equal(model.generate(**src, **kw, prompt_lookup_num_tokens=2), greedy)
    half = dict(do_sample=False, max_new_tokens=4, min_new_tokens=4, forced_eos_token_id=None)  # no EOS midway
    first = model.generate(**src, **half, return_dict_in_generate=True)
    assert isinstance(getattr(first, CACHE_KWARG), HfAttnCache)
    # Marian starts decoding with its pad token: the mask keeps generate from hiding it (stock transformers too)
    rest = model.generate(**src, **half, decoder_input_ids=first.sequences, decoder_attention_mask=torch.ones_like(
        first.sequences), **{CACHE_KWARG: getattr(first, CACHE_KWARG)})
    assert torch.equal(rest, model.generate(**src, **kw, forced_eos_token_id=None))


@pytest.mark.parametrize("base", BASES)
@pytest.mark.parametrize("preset", ["ran-d", "synthesizer"])
def test_default_generation_length_is_stock(base, preset):
    """With no length given, generate makes as many tokens as the stock model (20 new tokens, at most
    max_position_embeddings), also when that is below the variant's Lmax (capping never lengthens)."""
    src = src_of(tiny_batch(batch=2))
    no_eos = dict(suppress_tokens=[EOS], forced_eos_token_id=None)
    for positions in (64, 16):
        torch.manual_seed(0)
        config_cls, model_cls = STOCK[base]
        stock = model_cls(config_cls(**{**TINY, **BASE_DEFAULTS[base], "max_position_embeddings": positions})).eval()
        ours = tiny_model(base, preset, max_position_embeddings=positions)
        want = stock.generate(**src, **no_eos).shape
        assert ours.generate(**src, **no_eos).shape == want == (2, min(21, positions))
