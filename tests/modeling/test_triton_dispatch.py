"""Where attention runs (`hf_attn.modeling.fused.dispatch`: SDPA, a fused Triton kernel or eager): its truth table
(mode auto / triton / eager x CPU / CUDA tensor x weights asked for x attn_implementation="eager" x Triton's
interpreter on / off x triton installed or not), the config field, the environment override, the one-line errors
where "triton" cannot run, and the model's ``eager_attention`` flag (the "eager" request, and forward passes that
ask for weights or details, which analysis uses)."""

from __future__ import annotations

import itertools
from types import SimpleNamespace

import pytest
import torch
from conftest import requires_triton, tiny_batch, tiny_config, tiny_model

from hf_attn.modeling import HfAttnConfigError, HfAttnMarianMTModel, fused


class FakeTensor:
    """What the predicate reads of a tensor: ``is_cuda`` and ``device`` (a CUDA tensor without a GPU)."""

    def __init__(self, cuda: bool):
        self.is_cuda = cuda
        self.device = torch.device("cuda:0" if cuda else "cpu")


def use_triton(module, tensor, need_weights: bool = False, supported: bool = True) -> bool:
    """`fused.dispatch` for a Triton kernel: True when the call takes it."""
    return fused.dispatch(module, tensor, fused.TRITON, need_weights, supported) == fused.TRITON


def module(mode: str, eager_request: bool = False):
    return SimpleNamespace(config=SimpleNamespace(attention_kernels=mode), eager_attention=eager_request,
                           variant="rela", site="encoder")


CASES = list(itertools.product(fused.KERNEL_MODES, (False, True), (False, True), (False, True), (False, True),
                               (False, True)))


def expected(mode, cuda, need_weights, eager_request, interpret, installed):
    """The documented rules (fused.py, docs/speed.md "On a GPU"), written as a table: True, False or "error"."""
    if need_weights or eager_request or mode == "eager":
        return False  # weights, the "eager" request and mode eager always take the eager path
    if mode == "auto":
        return installed and cuda  # on CUDA where triton is installed; never the interpreter
    if not installed:
        return "error"  # mode triton without triton
    return True if cuda or interpret else "error"  # a CPU tensor only under the interpreter


@pytest.mark.parametrize("mode,cuda,need_weights,eager_request,interpret,installed", CASES)
def test_triton_predicate_truth_table(monkeypatch, mode, cuda, need_weights, eager_request, interpret, installed):
    monkeypatch.delenv(fused.KERNELS_ENV, raising=False)
    monkeypatch.setenv("TRITON_INTERPRET", "1" if interpret else "0")
    monkeypatch.setattr(fused, "triton", object() if installed else None)
    want = expected(mode, cuda, need_weights, eager_request, interpret, installed)
    call = lambda: use_triton(module(mode, eager_request), FakeTensor(cuda), need_weights)  # noqa: E731
    if want == "error":
        with pytest.raises(HfAttnConfigError, match="attention_kernels='triton'") as err:
            call()
        assert "\n" not in str(err.value)
    else:
        assert call() is want


def test_triton_mode_errors_say_what_is_missing(monkeypatch):
    monkeypatch.delenv(fused.KERNELS_ENV, raising=False)
    monkeypatch.setattr(fused, "triton", None)
    with pytest.raises(HfAttnConfigError, match="needs the triton package, which is not installed: pip install triton"):
        use_triton(module("triton"), FakeTensor(True))
    monkeypatch.setattr(fused, "triton", object())
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(HfAttnConfigError, match="run on CUDA tensors, and this one is on cpu; .*TRITON_INTERPRET=1"):
        use_triton(module("triton"), FakeTensor(False))
    monkeypatch.setenv(fused.KERNELS_ENV, "triton")  # the error names where "triton" came from
    with pytest.raises(HfAttnConfigError, match="^HF_ATTN_KERNELS='triton'"):
        use_triton(module("auto"), FakeTensor(False))


def test_triton_env_var_overrides_the_config(monkeypatch):
    monkeypatch.setattr(fused, "triton", object())
    monkeypatch.setenv(fused.KERNELS_ENV, "eager")
    assert use_triton(module("triton"), FakeTensor(True)) is False
    monkeypatch.setenv(fused.KERNELS_ENV, "triton")
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert use_triton(module("eager"), FakeTensor(False)) is True
    monkeypatch.setenv(fused.KERNELS_ENV, "fast")
    with pytest.raises(HfAttnConfigError, match=r"^HF_ATTN_KERNELS='fast' is not a kernel mode; valid: \['auto', "):
        use_triton(module("auto"), FakeTensor(True))
    monkeypatch.setenv(fused.KERNELS_ENV, "")  # empty = unset
    assert use_triton(module("auto"), FakeTensor(True)) is True


def test_triton_decisions_are_recorded_only_when_asked(monkeypatch):
    monkeypatch.delenv(fused.KERNELS_ENV, raising=False)
    monkeypatch.setattr(fused, "triton", object())
    use_triton(module("auto"), FakeTensor(True))
    with fused.record_paths() as trace:
        use_triton(module("auto"), FakeTensor(True))
        use_triton(module("auto"), FakeTensor(True), need_weights=True)
    use_triton(module("auto"), FakeTensor(True))
    assert trace == [("rela", "encoder", "triton"), ("rela", "encoder", "eager")]


def test_attention_kernels_config_field():
    assert tiny_config("marian", "rela-g").attention_kernels == "auto"
    assert tiny_config("bart", "rela-g", attention_kernels="eager").attention_kernels == "eager"
    with pytest.raises(HfAttnConfigError, match=r"^attention_kernels='cuda' is not a kernel mode; valid: \['auto', "
                                                r"'triton', 'eager'\]"):
        tiny_config("marian", "rela-g", attention_kernels="cuda")


def test_attention_kernels_survives_save_and_load(tmp_path):
    model = tiny_model("marian", "rela-g", attention_kernels="eager")
    model.save_pretrained(tmp_path)
    assert HfAttnMarianMTModel.from_pretrained(tmp_path).config.attention_kernels == "eager"


def test_attention_kernels_is_a_train_flag():
    from hf_attn.cli.train_args import parse_train_args

    _, _, overrides, _ = parse_train_args(["--preset", "rela-g", "--attention_kernels", "eager", "--output_dir", "x"])
    assert overrides["attention_kernels"] == "eager"


def eager_flags(model) -> set:
    return {m.eager_attention for m in model.attention_modules()}


@pytest.mark.parametrize("base", ["marian", "bart"])
def test_eager_request_puts_every_module_on_the_eager_path(base):
    model = tiny_model(base, "rela-g")
    assert eager_flags(model) == {False}
    model.set_attn_implementation("eager")
    assert eager_flags(model) == {True}
    model.set_attn_implementation("hf_attn")
    assert eager_flags(model) == {False}
    config = tiny_config(base, "rela-g")
    config._attn_implementation = "eager"  # the config path (from_pretrained(..., attn_implementation="eager"))
    assert eager_flags(type(model)(config)) == {True}


def spy_on_decisions(monkeypatch, model) -> list:
    """The Triton decision each attention module would make at each call (recorded before its attend runs)."""
    seen = []
    for m in model.attention_modules():
        original = m.attend

        def spy(*a, _m=m, _original=original, **k):
            seen.append(use_triton(_m, a[2], need_weights=False))
            return _original(*a, **k)

        monkeypatch.setattr(m, "attend", spy)
    return seen


@pytest.mark.parametrize("ask", [dict(output_attention_details=True), dict(output_attentions=True)])
def test_forward_asking_for_maps_runs_eager_then_restores(monkeypatch, ask):
    """Analysis asks for weights (output_attentions) or details: the predicate sees the eager flag during that
    forward pass, even with the kernels forced, and the model's own setting comes back afterwards."""
    monkeypatch.setenv(fused.KERNELS_ENV, "triton")
    model = tiny_model("marian", "rela-g")
    seen = spy_on_decisions(monkeypatch, model)
    with torch.no_grad():
        model(**tiny_batch(), **ask)
    assert seen and not any(seen)
    assert eager_flags(model) == {False}


@requires_triton
def test_forced_triton_reaches_every_module(monkeypatch, test_device):
    """Without a request for maps, the forced mode reaches the predicate in every module (CPU: the interpreter)."""
    monkeypatch.setenv(fused.KERNELS_ENV, "triton")
    # two heads (of 16 dimensions): half the interpreted kernel programs of four
    model = tiny_model("marian", "rela-g", encoder_attention_heads=2, decoder_attention_heads=2).to(test_device)
    seen = spy_on_decisions(monkeypatch, model)
    with torch.no_grad():
        model(**{k: v.to(test_device) for k, v in tiny_batch().items()})
    assert len(seen) == 6 and all(seen)


# ---- the kernels' test set-up itself: a one-line Triton kernel on `test_device` (the interpreter on the CPU) --------
if fused.triton_available():
    tl = fused.tl

    @fused.triton.jit
    def _scaled_add(x_ptr, y_ptr, out_ptr, n, alpha, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        keep = offs < n
        x = tl.load(x_ptr + offs, mask=keep)
        y = tl.load(y_ptr + offs, mask=keep)
        tl.store(out_ptr + offs, x + alpha * y, mask=keep)


@requires_triton
def test_triton_kernel_runs_on_the_test_device(test_device):
    """A Triton kernel runs on the tests' device (CPU tensors: Triton's interpreter, as conftest sets it up; cuda:
    compiled); skipped, not failed, where triton is missing (tests/test_without_triton.py checks that)."""
    x, y = torch.randn(37, device=test_device), torch.randn(37, device=test_device)
    out = torch.empty_like(x)
    _scaled_add[(3,)](x, y, out, 37, 0.5, BLOCK=16)
    torch.testing.assert_close(out, x + 0.5 * y)


@requires_triton
@pytest.mark.parametrize("preset,variant", [("rela-g", "rela"), ("reluformer", "reluformer")])
def test_a_call_the_kernel_cannot_take_runs_eager_and_is_recorded_eager(preset, variant):
    """Kernels forced on, a head of 136 dimensions (the ReLU kernel takes at most 128): the call falls back to the
    eager path and the recorded decision says "eager", as the runs' `attention_path` and the GPU suite's kernel table
    read it; heads of 16 dimensions take the kernel (one layer per site and two heads here: the fewest
    interpreted kernel programs)."""
    batch = tiny_batch()
    paths = {}
    one_layer = dict(encoder_layers=1, decoder_layers=1)
    for name, sizes in {"fits": dict(encoder_attention_heads=2, decoder_attention_heads=2, **one_layer),
                        "too wide": dict(d_model=136, encoder_attention_heads=1, decoder_attention_heads=1)}.items():
        model = tiny_model("marian", preset, attention_kernels="triton", **sizes).train()
        with fused.record_paths() as trace:
            model(**batch)
        paths[name] = {path for v, _, path in trace if v == variant}
    assert paths == {"fits": {"triton"}, "too wide": {"eager"}}


# ---- one decision for every path: SDPA (softmax's plain one, GMM's distributed product), Triton, eager ----------
def expected_sdpa(mode, cuda, need_weights, eager_request, supported):
    """GMM's SDPA path (its product distributed over the fusion): the Triton rules without the need for triton."""
    if need_weights or eager_request or mode == "eager" or not supported:
        return fused.EAGER
    return fused.SDPA if cuda or mode == "triton" else fused.EAGER


@pytest.mark.parametrize("mode,cuda,need_weights,eager_request,supported,installed",
                         list(itertools.product(fused.KERNEL_MODES, *[(False, True)] * 5)))
def test_sdpa_path_truth_table(monkeypatch, mode, cuda, need_weights, eager_request, supported, installed):
    monkeypatch.delenv(fused.KERNELS_ENV, raising=False)
    monkeypatch.setenv("TRITON_INTERPRET", "0")  # the SDPA path needs neither triton nor its interpreter
    monkeypatch.setattr(fused, "triton", object() if installed else None)
    path = fused.dispatch(module(mode, eager_request), FakeTensor(cuda), fused.SDPA, need_weights, supported)
    assert path == expected_sdpa(mode, cuda, need_weights, eager_request, supported)


@pytest.mark.parametrize("mode", fused.KERNEL_MODES)
def test_plain_sdpa_leaves_only_for_weights(monkeypatch, mode):
    """Softmax's SDPA is its own implementation (stock's too): no kernel mode or eager request changes it."""
    monkeypatch.setenv(fused.KERNELS_ENV, mode)
    monkeypatch.setattr(fused, "triton", None)
    for cuda, eager_request in itertools.product((False, True), (False, True)):
        m = module(mode, eager_request)
        assert fused.dispatch(m, FakeTensor(cuda), fused.SDPA, plain=True) == fused.SDPA
        assert fused.dispatch(m, FakeTensor(cuda), fused.SDPA, need_weights=True, plain=True) == fused.EAGER


def recorded(preset: str, **overrides) -> dict:
    """{(variant, site): the paths recorded} in one training forward of a tiny model of ``preset``."""
    model = tiny_model("marian", preset, **overrides).train()
    with fused.record_paths() as trace:
        model(**tiny_batch())
    out: dict = {}
    for variant, site, path in trace:
        out.setdefault((variant, site), set()).add(path)
    return out


def test_every_variant_with_a_fast_path_decides_through_dispatch(monkeypatch):
    """On the CPU in mode auto: softmax records its SDPA, GMM, ReLA, ReLUFormer, calibration and sparsemax eager; the
    variants without a fast path (RAN) decide nothing."""
    monkeypatch.delenv(fused.KERNELS_ENV, raising=False)
    assert recorded("gmm") == {("softmax", "encoder"): {"sdpa"}, ("softmax", "decoder"): {"sdpa"},
                               ("gmm", "cross"): {"eager"}}
    for preset, variant in (("rela-g", "rela"), ("reluformer", "reluformer"), ("sparsemax", "sparsemax")):
        assert {v for v, _ in recorded(preset)} == {variant} and set().union(*recorded(preset).values()) == {"eager"}
    assert recorded("calibration-gate")[("calibrated", "cross")] == {"eager"}
    assert ("recurrent", "encoder") not in recorded("ran-all")


def test_gmm_sdpa_path_is_recorded_as_taken(monkeypatch):
    """Forced on a CPU (no triton needed), GMM's cross-attention takes and records its SDPA path; attention dropout
    keeps it eager (the paper drops gamma with one mask)."""
    monkeypatch.setenv(fused.KERNELS_ENV, "triton")
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    assert recorded("gmm")[("gmm", "cross")] == {"sdpa"}
    assert recorded("gmm", attention_dropout=0.1)[("gmm", "cross")] == {"eager"}


class WordsTokenizer:
    """What `run_extras.attention_path` asks of a tokenizer: ids of a source and a target sentence."""

    def __call__(self, sources, text_target, return_tensors):
        return {"input_ids": torch.tensor([[5, 6, 7, 2]]), "attention_mask": torch.ones(1, 4, dtype=torch.long),
                "labels": torch.tensor([[8, 9, 2]])}


def test_run_attention_path_names_the_path_each_site_took(monkeypatch):
    from hf_attn.reproduce.run_extras import attention_path

    monkeypatch.setenv("TRITON_INTERPRET", "0")
    cpu = torch.device("cpu")
    monkeypatch.setenv(fused.KERNELS_ENV, "triton")  # GMM's SDPA path runs forced on the CPU, without triton
    gmm = attention_path(tiny_model("marian", "gmm"), WordsTokenizer(), cpu)
    assert gmm["sites"] == {"encoder": "sdpa", "decoder": "sdpa", "cross": "sdpa"} and gmm["kernels"] == "triton"
    monkeypatch.setenv(fused.KERNELS_ENV, "eager")
    gmm = attention_path(tiny_model("marian", "gmm"), WordsTokenizer(), cpu)
    assert gmm["sites"] == {"encoder": "sdpa", "decoder": "sdpa", "cross": "eager"}
    monkeypatch.delenv(fused.KERNELS_ENV)
    assert set(attention_path(tiny_model("marian", "ran-all"), WordsTokenizer(), cpu)["sites"].values()) == {
        "eager", "sdpa"}  # RAN's encoder and decoder (no fast path), softmax's cross-attention


@requires_triton
def test_run_attention_path_records_the_kernel_and_its_fallback(monkeypatch):
    """Kernels forced (the interpreter on CPU tensors): rela-g's sites ran the fused kernel; with heads of 136
    dimensions (more than the kernel takes) every call fell back to eager, and the record says so."""
    from hf_attn.reproduce.run_extras import attention_path

    monkeypatch.setenv(fused.KERNELS_ENV, "triton")
    fits = attention_path(tiny_model("marian", "rela-g"), WordsTokenizer(), torch.device("cpu"))
    wide = attention_path(tiny_model("marian", "rela-g", d_model=136, encoder_attention_heads=1,
                                     decoder_attention_heads=1), WordsTokenizer(), torch.device("cpu"))
    assert set(fits["sites"].values()) == {"fused"} and set(wide["sites"].values()) == {"eager"}
