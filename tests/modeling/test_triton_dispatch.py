"""When attention runs on the fused Triton kernels (`hf_attn.modeling.fused.use_triton`): the predicate's truth table
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
    call = lambda: fused.use_triton(module(mode, eager_request), FakeTensor(cuda), need_weights)  # noqa: E731
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
        fused.use_triton(module("triton"), FakeTensor(True))
    monkeypatch.setattr(fused, "triton", object())
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(HfAttnConfigError, match="run on CUDA tensors, and this one is on cpu; .*TRITON_INTERPRET=1"):
        fused.use_triton(module("triton"), FakeTensor(False))
    monkeypatch.setenv(fused.KERNELS_ENV, "triton")  # the error names where "triton" came from
    with pytest.raises(HfAttnConfigError, match="^HF_ATTN_KERNELS='triton'"):
        fused.use_triton(module("auto"), FakeTensor(False))


def test_triton_env_var_overrides_the_config(monkeypatch):
    monkeypatch.setattr(fused, "triton", object())
    monkeypatch.setenv(fused.KERNELS_ENV, "eager")
    assert fused.use_triton(module("triton"), FakeTensor(True)) is False
    monkeypatch.setenv(fused.KERNELS_ENV, "triton")
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert fused.use_triton(module("eager"), FakeTensor(False)) is True
    monkeypatch.setenv(fused.KERNELS_ENV, "fast")
    with pytest.raises(HfAttnConfigError, match=r"^HF_ATTN_KERNELS='fast' is not a kernel mode; valid: \['auto', "):
        fused.use_triton(module("auto"), FakeTensor(True))
    monkeypatch.setenv(fused.KERNELS_ENV, "")  # empty = unset
    assert fused.use_triton(module("auto"), FakeTensor(True)) is True


def test_triton_decisions_are_recorded_only_when_asked(monkeypatch):
    monkeypatch.delenv(fused.KERNELS_ENV, raising=False)
    monkeypatch.setattr(fused, "triton", object())
    fused.use_triton(module("auto"), FakeTensor(True))
    with fused.record_paths() as trace:
        fused.use_triton(module("auto"), FakeTensor(True))
        fused.use_triton(module("auto"), FakeTensor(True), need_weights=True)
    fused.use_triton(module("auto"), FakeTensor(True))
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
    """The `use_triton` decision each attention module would make at each call (recorded before its attend runs)."""
    seen = []
    for m in model.attention_modules():
        original = m.attend

        def spy(*a, _m=m, _original=original, **k):
            seen.append(fused.use_triton(_m, a[2], need_weights=False))
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
    model = tiny_model("marian", "rela-g").to(test_device)
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
    read it; heads of 16 dimensions take the kernel."""
    batch = tiny_batch()
    paths = {}
    for name, sizes in {"fits": {}, "too wide": dict(d_model=136, encoder_attention_heads=1,
                                                     decoder_attention_heads=1)}.items():
        model = tiny_model("marian", preset, attention_kernels="triton", **sizes).train()
        with fused.record_paths() as trace:
            model(**batch)
        paths[name] = {path for v, _, path in trace if v == variant}
    assert paths == {"fits": {"triton"}, "too wide": {"eager"}}
