"""Core behaviour: equivalence with vanilla models, checkpoint conversion, registration, errors, numerics."""

from __future__ import annotations

import pytest
import torch
from conftest import attention_context, BASE_DEFAULTS, TINY, tiny_batch, tiny_config, tiny_model
from transformers import AutoConfig, AutoModelForSeq2SeqLM
from transformers.models.marian.modeling_marian import MarianAttention

import hf_attn
from hf_attn.modeling import BASES, attention_softmax
from hf_attn.modeling.attention_base import VariantAttention, attention_class
from hf_attn.modeling.attention_rela import RelaAttention
from hf_attn.modeling.hyperparameters import HfAttnConfigError
from hf_attn.modeling.masking import KeepMask

VANILLA = {name: (b.stock_config_class, b.stock_model_class) for name, b in BASES.items()}


def vanilla_model(base, seed=0):
    torch.manual_seed(seed)
    config_cls, model_cls = VANILLA[base]
    return model_cls(config_cls(**TINY, **BASE_DEFAULTS[base])).eval()


@pytest.mark.parametrize("base", ["marian", "bart"])
def test_softmax_preset_matches_vanilla_logits(base):
    vanilla = vanilla_model(base)
    ours = tiny_model(base, "softmax")
    missing, unexpected = ours.load_state_dict(vanilla.state_dict(), strict=True)
    b = tiny_batch()
    with torch.no_grad():
        expected = vanilla(**b).logits
        got = ours(**b).logits
    assert (got - expected).abs().max() < 1e-5


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
                            cache=cache, use_cache=True)
                cache = out.cache
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


@pytest.mark.parametrize("base", ["marian", "bart"])
def test_swap_attention_on_saved_vanilla_checkpoint(base, tmp_path):
    vanilla = vanilla_model(base, seed=3)
    vanilla.save_pretrained(tmp_path / "vanilla")
    b = tiny_batch()
    with torch.no_grad():
        expected = vanilla(**b).logits

    soft = hf_attn.swap_attention(str(tmp_path / "vanilla"), "softmax").eval()
    assert soft.config.model_type == f"hf_attn_{base}"
    with torch.no_grad():
        assert (soft(**b).logits - expected).abs().max() < 1e-5

    rela = hf_attn.swap_attention(vanilla, "rela-g", rela_gain_init="ones")
    ref = vanilla.state_dict()
    copied = [k for k in rela.state_dict() if k in ref]
    assert any("q_proj" in k for k in copied) and any("fc1" in k for k in copied)
    for key in copied:
        assert torch.equal(rela.state_dict()[key], ref[key]), key
    new = set(rela.state_dict()) - set(ref)
    assert new and all("rela_" in k for k in new)
    # the architecture is the checkpoint's, the attention is the preset's
    assert rela.config.d_model == vanilla.config.d_model and rela.config.encoder_attention == "rela"


def test_swap_attention_rejects_other_models():
    with pytest.raises(HfAttnConfigError, match="MarianMTModel and BartForConditionalGeneration"):
        hf_attn.swap_attention(torch.nn.Linear(2, 2), "rela-g")


def test_import_registers_auto_classes(tmp_path):
    config = tiny_config("marian", "rela-g")
    assert type(AutoConfig.for_model("hf_attn_bart")) is hf_attn.HfAttnBartConfig
    model = AutoModelForSeq2SeqLM.from_config(config)
    assert isinstance(model, hf_attn.HfAttnMarianMTModel)
    model.save_pretrained(tmp_path)
    again = AutoModelForSeq2SeqLM.from_pretrained(tmp_path)  # in-process: no trust_remote_code needed
    assert type(again) is hf_attn.HfAttnMarianMTModel
    assert again.config._attn_implementation == "hf_attn"


@pytest.mark.parametrize(
    "overrides,pattern",
    [
        ({"encoder_attention": "relaa"}, r"encoder_attention='relaa' is not an attention variant \(did you mean 'rela'\?\)"),
        ({"cross_attention": ["rela"]}, r"cross_attention lists 1 variants but the model has 2 layers"),
        ({"decoder_attention_layers": [5]}, r"decoder_attention_layers=\[5\]: need layer indices in 0..1"),
        ({"rela_norm": "batchnorm"}, r"rela_norm='batchnorm' is not valid; choose one of \['rmsnorm', 'layernorm', 'none'\]"),
        ({"rela_eps": 0.0}, r"rela_eps=0.0 must be a finite number > 0 \(default 1e-08: "),
        ({"rela_nrom": "rmsnorm"}, r"unknown attention hyperparameter 'rela_nrom' \(did you mean 'rela_norm'\?\)"),
    ],
)
def test_bad_configuration_gives_one_clear_error(overrides, pattern):
    with pytest.raises(HfAttnConfigError, match=pattern):
        tiny_config("marian", "rela-g", **overrides)


def test_unknown_preset_names_the_choices():
    with pytest.raises(HfAttnConfigError, match=r"unknown preset 'rela-x'.*valid presets: \["):
        hf_attn.HfAttnMarianConfig.from_preset("rela-x")


def test_variant_on_unsupported_site(monkeypatch):
    class CrossOnly(RelaAttention):
        variant = "cross-only-test"
        sites = ("cross",)
        presets = ()

    monkeypatch.setitem(hf_attn.ATTENTION_VARIANTS, "cross-only-test", CrossOnly)
    with pytest.raises(HfAttnConfigError, match=r"variant 'cross-only-test' only supports the \['cross'\] site"):
        tiny_config("marian", "softmax", encoder_attention="cross-only-test")
    tiny_config("marian", "softmax", cross_attention="cross-only-test")  # the supported site is fine


def test_layer_subsets_and_per_layer_lists():
    config = tiny_config("marian", "rela-g", encoder_attention_layers=[1], decoder_attention=["softmax", "rela"])
    assert config.attention_layout() == {
        "encoder": ["softmax", "rela"],
        "decoder": ["softmax", "rela"],
        "cross": ["rela", "rela"],
    }
    model = hf_attn.HfAttnMarianMTModel(config)
    assert [m.variant for m in model.attention_modules("encoder")] == ["softmax", "rela"]


def test_missing_entmax_names_the_install_command(monkeypatch):
    monkeypatch.setattr(attention_softmax, "sparsemax", None)
    with pytest.raises(ImportError, match=r"pip install entmax"):
        tiny_model("marian", "sparsemax")


def _module(mixin, **config_overrides):
    config = tiny_config("marian", "softmax", **config_overrides)
    cls = attention_class(MarianAttention, mixin)
    module = cls(embed_dim=32, num_heads=4, config=config, layer_idx=0, site="cross")
    from transformers import initialization as init

    module.init_variant_weights(init)
    return module.eval()


@pytest.mark.parametrize("mixin", [attention_softmax.SparsemaxAttention, attention_softmax.Entmax15Attention])
@pytest.mark.parametrize("grad", [True, False], ids=["train", "decode"])
def test_entmax_family_float32_under_autocast_and_empty_rows(mixin, grad, monkeypatch):
    module = _module(mixin)
    seen = []
    for name in ("normaliser", "forward_only"):
        original = getattr(mixin, name)
        monkeypatch.setattr(mixin, name, staticmethod(lambda scores, f=original, n=name: seen.append((n, scores.dtype))
                                                      or f(scores)))
    q, k, v = (torch.randn(2, 4, 5, 8, requires_grad=grad) for _ in range(3))
    keep = torch.ones(2, 1, 5, 5, dtype=torch.bool)
    keep[1] = False  # a fully masked example: must not crash or NaN
    keep[0, :, :, 3:] = False
    with torch.autocast("cpu", dtype=torch.bfloat16):
        ctx, weights = module.attend(q.bfloat16(), k.bfloat16(), v.bfloat16(), KeepMask.from_dense(keep),
                                     attention_context(True))
    # the package's autograd function when a gradient is needed, the forward-only one otherwise
    assert seen == [("normaliser" if grad else "forward_only", torch.float32)]
    assert torch.isfinite(ctx.float()).all() and torch.isfinite(weights.float()).all()
    assert (weights[0, :, :, 3:] == 0).all()
    torch.testing.assert_close(weights[0].float().sum(-1), torch.ones(4, 5), rtol=1e-2, atol=1e-2)
    if grad:
        ctx.float().sum().backward()
        assert torch.isfinite(q.grad).all() and q.grad.abs().sum() > 0


@pytest.mark.parametrize("mixin", [attention_softmax.SparsemaxAttention, attention_softmax.Entmax15Attention])
def test_entmax_forward_only_equals_the_package(mixin):
    torch.manual_seed(0)
    z = torch.randn(64, 4, 3, 30) * 4
    z[0, :, :, -5:] = attention_softmax.MASKED_SCORE  # masked keys, as `attend` fills them
    z[1, 0, 0] = 0.5  # all tied
    z[2, 0, 0, :2] = 50.0  # a large tie at the top
    z[3] = z[3] * 100  # one-hot rows
    expected = mixin.normaliser(z)
    got = mixin.forward_only(z)
    torch.testing.assert_close(got, expected, rtol=0, atol=2e-6)
    assert torch.equal(got == 0, expected == 0)  # the same support


@pytest.mark.parametrize("preset", ["rela-g", "rela-i", "rela-g-layernorm", "relu-rmsnorm"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_rela_null_rows_give_zeros_not_nan(preset, dtype):
    model = tiny_model("marian", preset).to(dtype)
    module = model.model.decoder.layers[0].encoder_attn
    q = -torch.ones(2, 4, 3, 8, dtype=dtype)  # every score negative -> ReLU -> all-null rows
    k = torch.ones(2, 4, 6, 8, dtype=dtype)
    v = torch.randn(2, 4, 6, 8).to(dtype)
    keep = KeepMask.from_dense(torch.ones(2, 1, 3, 6, dtype=torch.bool))
    ctx, weights = module.attend(q, k, v, keep, attention_context(True))
    assert (weights == 0).all() and (ctx == 0).all()
    merged = module.normalise(ctx.transpose(1, 2).reshape(2, 3, 32))
    assert torch.isfinite(merged).all()
    if preset != "rela-g-layernorm":  # LayerNorm adds its bias (zero at init)
        assert (merged == 0).all()


def test_rela_norm_runs_in_float32_under_autocast():
    model = tiny_model("marian", "rela-g")
    module = model.model.encoder.layers[0].self_attn
    o = torch.randn(2, 3, 32).bfloat16() * 1e-3
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = module.normalise(o)
    z = o.float()
    ref = z * torch.rsqrt(z.pow(2).mean(-1, keepdim=True) + 1e-8) * torch.sigmoid(module.rela_gate_weight * z)
    torch.testing.assert_close(y.float(), ref, rtol=1e-2, atol=1e-2)


def test_rela_i_gain_init_is_uniform_in_the_papers_range():
    model = tiny_model("marian", "rela-i")
    gain = model.model.encoder.layers[0].self_attn.rela_gain
    bound = (3 / 8) ** 0.5  # dh = 32 / 4
    assert gain.abs().max() <= bound and gain.std() > 0.1 * bound
    gate = tiny_model("marian", "rela-g").model.encoder.layers[0].self_attn.rela_gate_weight
    assert gate.abs().max() <= (3 / 32) ** 0.5 and gate.std() > 0


def test_variant_params_survive_reload_and_are_not_reinitialised(tmp_path):
    model = tiny_model("marian", "rela-i")
    model.save_pretrained(tmp_path)
    again = hf_attn.HfAttnMarianMTModel.from_pretrained(tmp_path)
    for (n, a), (_, b) in zip(model.state_dict().items(), again.state_dict().items()):
        assert torch.equal(a, b), n


def test_every_registered_variant_is_a_mixin():
    for name, cls in hf_attn.ATTENTION_VARIANTS.items():
        assert issubclass(cls, VariantAttention) and cls.variant == name
        assert set(cls.sites) <= {"encoder", "decoder", "cross"}


@pytest.mark.parametrize("preset", sorted(hf_attn.PRESETS))
def test_loading_keeps_every_presets_frozen_weights_frozen(preset, tmp_path):
    """A resumed run's optimizer must see the trainable parameters of the run that saved it (gmm-only's k_proj once
    came back trainable, and resuming failed on the optimizer's parameter groups)."""
    model = tiny_model("marian", preset)
    frozen = sorted(n for n, p in model.named_parameters() if not p.requires_grad)
    model.save_pretrained(tmp_path)
    again = type(model).from_pretrained(tmp_path)
    assert sorted(n for n, p in again.named_parameters() if not p.requires_grad) == frozen


def test_loading_keeps_the_sinusoidal_positions_frozen(tmp_path):
    """transformers' loader swaps in trainable Parameters; fine-tuning or resuming must not train fixed tensors."""
    from transformers import AutoModelForSeq2SeqLM

    model = tiny_model("marian", "rela-g")
    frozen = sorted(n for n, p in model.named_parameters() if not p.requires_grad)
    assert frozen == ["model.decoder.embed_positions.weight", "model.encoder.embed_positions.weight"]
    model.save_pretrained(tmp_path)
    for again in (type(model).from_pretrained(tmp_path), AutoModelForSeq2SeqLM.from_pretrained(tmp_path)):
        assert sorted(n for n, p in again.named_parameters() if not p.requires_grad) == frozen


def keep_masks(t: int, s: int):
    """Compact masks of each kind (none, padding, fully padded, causal, causal + padding, cached) and a dense one."""
    pad = torch.ones(2, s, dtype=torch.bool)
    pad[1, s - 2:] = False
    yield KeepMask(t, s)
    yield KeepMask(t, s, pad)
    yield KeepMask(t, s, torch.stack([pad[0], torch.zeros(s, dtype=torch.bool)]))
    yield KeepMask(t, s, causal=True, offset=s - t)
    yield KeepMask(t, s, pad, causal=True, offset=s - t)
    yield KeepMask(1, s, pad, causal=True, offset=s - 1)
    yield KeepMask.from_dense(torch.rand(2, 1, t, s, generator=torch.Generator().manual_seed(0)) > 0.4)


@pytest.mark.parametrize("keep", list(keep_masks(4, 6)), ids=lambda m: f"{m.q_len}x{m.k_len}")
def test_keep_mask_helpers_match_the_dense_mask(keep):
    """What the variants read from a `KeepMask` equals the dense-mask definitions: fill where no key is visible
    (except rows with none, which see all), the 0/1 product, and the keys some query sees."""
    dense = keep.dense()
    scores = torch.randn(2, 3, keep.q_len, keep.k_len)
    hidden = ~(dense | ~dense.any(-1, keepdim=True))
    assert torch.equal(keep.fill_hidden(scores, -1e9), scores.masked_fill(hidden, -1e9))
    assert torch.equal(keep.zero_hidden(scores), scores * dense)
    filled = keep.scale_and_fill(scores, 0.125, -1e9)
    torch.testing.assert_close(filled, (scores * 0.125).masked_fill(hidden, -1e9), rtol=0, atol=1e-6)
    assert keep.scale_and_fill(scores, 0.125, -1e9).eq(filled).all()  # the bias is built once
    real = keep.real_keys()
    assert torch.equal(real.expand(2, 1, 1, keep.k_len), dense.any(-2, keepdim=True).expand(2, 1, 1, keep.k_len))
    assert keep.real_keys() is real  # built once per stack
    keep.sdpa_mask(torch.float32)
    keep.zero_hidden(scores[..., : keep.q_len - 1, :])  # a sub-block
    # what it builds once is kept under plain attribute names: dynamo cannot trace a dotted one ("_sdpa_torch.float32")
    assert all(name.isidentifier() for name in vars(keep)), sorted(vars(keep))


def test_masks_are_built_on_the_device_of_the_call():
    """A causal mask without padding holds no tensor: it must still build its blocks where the attention runs (on a
    GPU every ReLU-family, GMM and calibration training step once failed on a CPU mask). The meta device stands in
    for a GPU."""
    from hf_attn.modeling.masking import KeepMask, keep_from_mask, keep_mask_interface
    from transformers.masking_utils import causal_mask_function

    meta = torch.device("meta")
    made = [keep_from_mask(None, 3, 3, True, device=meta),
            keep_mask_interface(2, 3, 3, mask_function=causal_mask_function, attention_mask=None, device=meta)]
    model = tiny_model("marian", "rela-g").to("meta")
    made.append(model.model.decoder.layers[0].self_attn.keep_mask(None, 3, 3))
    for keep in made:
        assert isinstance(keep, KeepMask) and keep.padding is None and keep.causal
        assert keep.device == meta and keep.block(0, 3, 0, 3).device == meta
        assert keep.zero_hidden(torch.ones(2, 1, 3, 3, device=meta)).device == meta
        assert keep.last_keys(2).device == meta
