"""The GPU suite (`scripts/benchmark.py --gpu-suite`): on one CUDA GPU, in a few minutes, every headline preset against
stock transformers Marian with SDPA measured in the same run (interleaved rounds whose order rotates, the median of
the per-round ratios t_stock / t_preset, > 1 = faster):

- ``sentence``: bf16 training steps (autocast; forward, backward, AdamW) at base size on two batches (64 sentences of
  40 tokens with a quarter of the rows padded, and about 8k tokens), and beam-4 decoding with bf16 weights of 32
  sources of 40 tokens, forced to 32 new tokens; attention calibration also against its FLOP bound;
- ``long``: forward + backward of the whole model (bf16 autocast) at L = 1k, 4k, 16k source and target tokens, batch
  2 (smaller where memory requires it: the row says so), with the peak GPU memory relative to stock;
- ``compiled``: training steps of ``model.compile()``-d models against compiled stock;
- which kernel path (fused Triton or eager) each preset's variants took (`fused.record_paths`), and the device,
  torch / CUDA / triton / transformers versions and the date.

A time budget bounds the whole run: what would not fit is skipped and listed under ``skipped``. ``dry_run``: the same
code at tiny sizes on the CPU (seconds), to check the suite and its rendering without a GPU; its numbers are not
measurements of anything.
"""

from __future__ import annotations

import datetime
import gc
import os
import statistics
import time
from dataclasses import asdict, dataclass, replace

import torch
import transformers

from ..modeling import fused
from ..modeling.modeling_hf_attn import SDPA_VARIANTS
from .memory import peak_growth_mib
from .models import build_hf_attn, build_stock, config_fields, padded_batch
from .profile import matmul_flops
from .results import STOCK
from .timing import decode, forward_backward, interleaved, per_round, raise_recompile_limits, train_step, warm_up

GPU_PRESETS = ("softmax", "rela-g", "relu", "reluformer", "gmm", "calibration-gate", "ran-d", "ran-all", "sparsemax",
               "entmax15")
LONG_PRESETS = ("rela-g", "relu", "reluformer", "entmax15")
COMPILED_PRESETS = ("rela-g", "reluformer")
FLOP_BOUND_PRESETS = ("calibration-gate",)  # the presets whose training step is also set against its FLOP bound


@dataclass(frozen=True)
class GpuSuiteSettings:
    """What the suite runs; the defaults are the GPU setting, `dry_run_settings` the tiny CPU one."""

    presets: tuple[str, ...] = GPU_PRESETS
    long_presets: tuple[str, ...] = LONG_PRESETS
    compiled_presets: tuple[str, ...] = COMPILED_PRESETS
    d_model: int = 512
    layers: int = 6  # encoder and decoder layers each
    heads: int = 8
    ffn: int = 2048
    vocab: int = 32000
    train_batches: tuple[tuple[int, int], ...] = ((64, 40), (200, 40))  # (sentences, tokens): 64 x 40, ~8k tokens
    pad_fraction: float = 0.25
    decode_batch: int = 32
    decode_src_len: int = 40
    decode_len: int = 32
    beams: int = 4
    long_lengths: tuple[int, ...] = (1024, 4096, 16384)
    long_batch: int = 2
    repeats: int = 5
    long_repeats: int = 3
    compile_backend: str = "inductor"
    budget_s: float = 320.0  # the whole run, building and compiling included
    device: str = "cuda"
    dry_run: bool = False

    def fields(self, max_positions: int) -> dict:
        return config_fields("marian", self.d_model, self.layers, self.heads, self.ffn, self.vocab, max_positions)


def restricted(s: GpuSuiteSettings, presets) -> GpuSuiteSettings:
    """``s`` with each section limited to ``presets`` (softmax stays in the sentence-level one)."""
    keep = lambda names: tuple(n for n in names if n in presets)  # noqa: E731
    return replace(s, presets=("softmax", *keep(s.presets[1:])), long_presets=keep(s.long_presets),
                   compiled_presets=keep(s.compiled_presets))


def dry_run_settings() -> GpuSuiteSettings:
    """Tiny sizes on the CPU, every section and preset: seconds, for the tests."""
    return GpuSuiteSettings(d_model=32, layers=1, heads=2, ffn=64, vocab=64, train_batches=((4, 8), (8, 8)),
                            decode_batch=2, decode_src_len=6, decode_len=3, beams=2, long_lengths=(16, 32),
                            repeats=1, long_repeats=1, compile_backend="eager", budget_s=600.0, device="cpu",
                            dry_run=True)


class Deadline:
    """The suite's time budget: what is left, and the list of what was skipped for want of it."""

    def __init__(self, seconds: float):
        self.end = time.monotonic() + seconds
        self.skipped: list[str] = []

    def left(self) -> float:
        return self.end - time.monotonic()

    def section(self, share: float) -> "Deadline":
        """A deadline for one section: ``share`` of the time left, sharing this one's skipped list."""
        sub = Deadline(0.0)
        sub.end, sub.skipped = time.monotonic() + share * max(0.0, self.left()), self.skipped
        return sub

    def allows(self, seconds: float, what: str) -> bool:
        if self.left() >= seconds:
            return True
        self.skipped.append(f"{what}: skipped, {max(0.0, self.left()):.0f} s of the time budget left")
        return False


def train_step_bf16(model, optimizer, batch) -> float:
    """A bf16 mixed-precision training step: forward under autocast, backward, AdamW; the loss."""
    return train_step(model, optimizer, batch, torch.bfloat16)


def forward_backward_bf16(model, batch) -> float:
    """Forward (bf16 autocast) and backward of the whole model, no optimiser step; the loss."""
    return forward_backward(model, batch, torch.bfloat16)


def environment(s: GpuSuiteSettings, command: str) -> dict:
    cuda = s.device.startswith("cuda")
    return {
        "device": torch.cuda.get_device_name(torch.device(s.device)) if cuda else f"CPU ({os.cpu_count()} cores)",
        "torch": torch.__version__, "cuda": torch.version.cuda if cuda else None,
        "triton": getattr(fused.triton, "__version__", None), "transformers": transformers.__version__,
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"), "command": command,
        "kernels_env": os.environ.get(fused.KERNELS_ENV) or None,
    }


def build_models(s: GpuSuiteSettings, presets, max_positions: int) -> dict:
    """{name: (model, AdamW)}: stock SDPA first (holding hf-attn softmax's weights), then each preset."""
    fields = s.fields(max_positions)
    softmax = build_hf_attn("marian", "softmax", fields, seed=0, device=s.device)
    models = {STOCK: build_stock("marian", fields, softmax, device=s.device)}
    for name in presets:
        models[name] = softmax if name == "softmax" else build_hf_attn("marian", name, fields, seed=0,
                                                                         device=s.device)
    return {name: (m, torch.optim.AdamW(m.parameters(), lr=1e-4)) for name, m in models.items()}


def paths_of(model, trace: list) -> dict:
    """{variant: path} for every variant of ``model``: "triton" / "eager" / "mixed" from its `fused.record_paths`
    decisions; a variant that made none runs "sdpa" (softmax) or "eager" (no fused kernel)."""
    decided: dict = {}
    for variant, _, path in trace:
        decided.setdefault(variant, set()).add(path)
    out = {}
    for cls in model.variant_classes():
        paths = decided.get(cls.variant)
        if paths:
            out[cls.variant] = paths.pop() if len(paths) == 1 else "mixed"
        else:
            out[cls.variant] = "sdpa" if cls.variant in SDPA_VARIANTS else "eager"
    return out


def one_line(error: BaseException) -> str:
    return f"{type(error).__name__}: {str(error).strip().splitlines()[0] if str(error).strip() else ''}"[:300]


def warm_and_record(step, models: dict, paths: dict, call: str, errors: dict) -> dict:
    """One untimed call of ``step(model, opt)`` per model (the warm-up, which compiles the kernels), recording each
    preset's kernel decisions into ``paths[preset][call]``. A preset whose call fails is left out of the returned
    models and its error kept in ``errors`` (one GPU run should measure the rest); stock's failure is raised."""
    kept = {}
    for name, (model, opt) in models.items():
        try:
            with fused.record_paths() as trace:
                step(model, opt)
        except Exception as e:  # noqa: BLE001 - any preset's failure is reported, not fatal
            if name == STOCK:
                raise
            errors[f"{call} {name}"] = one_line(e)
            continue
        kept[name] = (model, opt)
        if name != STOCK:
            paths.setdefault(name, {})[call] = paths_of(model, trace)
    return kept


def timed_rounds(s: GpuSuiteSettings, step, models: dict, repeats: int, desc: str, deadline: Deadline) -> dict:
    """{name: [seconds per round]} of ``step(model, opt)``, `timing.interleaved` rounds; fewer than ``repeats`` (at
    least one) when the deadline would pass during the next round (noted in the deadline's skipped list)."""

    def out_of_time(done: int, last_round_s: float) -> bool:
        if deadline.left() >= last_round_s:
            return False
        deadline.skipped.append(f"{desc}: {done} of {repeats} rounds (time budget)")
        return True

    return interleaved(s.device, step, models, repeats, desc, out_of_time)


def ratio_rows(times: dict, extra: dict | None = None) -> list[dict]:
    """Per model: median seconds and the median per-round ratio t_stock / t_model (> 1 = faster)."""
    return [{"preset": name, "median_s": statistics.median(t),
             "ratio_vs_stock": statistics.median(per_round(times, name)), **(extra or {}).get(name, {})}
            for name, t in times.items()]


def flop_bounds(step, models: dict) -> dict:
    """{preset: {"flop_bound": stock's matrix-product FLOPs / the preset's}} for `FLOP_BOUND_PRESETS`, counted with
    the kernels off (the FLOP bound is the math's: a fused kernel's products are invisible to FlopCounterMode)."""
    if not any(p in models for p in FLOP_BOUND_PRESETS):
        return {}
    before = os.environ.get(fused.KERNELS_ENV)
    os.environ[fused.KERNELS_ENV] = "eager"
    try:
        stock = matmul_flops(step, *models[STOCK])
        return {p: {"flop_bound": stock / matmul_flops(step, *models[p])} for p in FLOP_BOUND_PRESETS if p in models}
    finally:
        os.environ.pop(fused.KERNELS_ENV) if before is None else os.environ.__setitem__(fused.KERNELS_ENV, before)


def free(models: dict) -> None:
    models.clear()
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


# ---------------------------------------------------------------------------------------------------------------
# The three sections
# ---------------------------------------------------------------------------------------------------------------
def run_sentence(s: GpuSuiteSettings, deadline: Deadline, paths: dict, errors: dict) -> list[dict]:
    """bf16 training steps on each batch, then beam search with bf16 weights: one table each."""
    models = build_models(s, s.presets, max(512, s.decode_src_len, s.decode_len + 2, *(t for _, t in s.train_batches)))
    tables = []
    for n, length in s.train_batches:
        what = f"train {n} x {length}"
        if not deadline.allows(10.0 if not s.dry_run else 0.0, what):
            continue
        batch = padded_batch(s.vocab, n, length, length, s.pad_fraction, s.device)
        step = lambda model, opt, batch=batch: train_step_bf16(model, opt, batch)  # noqa: E731
        ok = warm_and_record(step, models, paths, "train", errors)
        times = timed_rounds(s, step, ok, s.repeats, what, deadline)
        tables.append({"call": "train", "sentences": n, "tokens": length, "rounds": len(times[STOCK]),
                       "rows": ratio_rows(times, flop_bounds(step, ok))})
    if deadline.allows(10.0 if not s.dry_run else 0.0, "decode"):
        for model, _ in models.values():
            model.to(torch.bfloat16)
        dec = padded_batch(s.vocab, s.decode_batch, s.decode_src_len, None, s.pad_fraction, s.device)
        step = lambda model, opt: decode(model, dec, s.beams, s.decode_len)  # noqa: E731
        ok = warm_and_record(step, models, paths, "decode", errors)
        times = timed_rounds(s, step, ok, s.repeats, "decode", deadline)
        tables.append({"call": "decode", "sentences": s.decode_batch, "tokens": s.decode_src_len,
                       "rounds": len(times[STOCK]), "rows": ratio_rows(times)})
    free(models)
    return tables


def out_of_memory(error: BaseException) -> bool:
    return isinstance(error, torch.cuda.OutOfMemoryError) or "out of memory" in str(error).lower()


def fit_batch(s: GpuSuiteSettings, models: dict, length: int) -> tuple[int, dict, dict, dict]:
    """(batch size, {name: seconds of one call}, {name: peak MiB}, {name: problem}) at ``length``: the largest batch
    <= long_batch at which every model that fits at all runs one forward + backward (the warm-up); a model that runs
    out of memory at batch 1, or fails otherwise, is in the problems instead."""
    for size in range(s.long_batch, 0, -1):
        batch = padded_batch(s.vocab, size, length, length, s.pad_fraction, s.device)
        seconds, peaks, problems = {}, {}, {}
        for name, (model, _) in models.items():
            try:
                start = time.monotonic()
                peaks[name] = peak_growth_mib(s.device, forward_backward_bf16, model, batch)
                seconds[name] = time.monotonic() - start
            except Exception as e:  # noqa: BLE001 - reported in the row
                model.zero_grad(set_to_none=True)
                problems[name] = "out of memory" if out_of_memory(e) else one_line(e)
                free({})
        if "out of memory" not in problems.values() or size == 1:
            return size, seconds, peaks, problems


def run_long(s: GpuSuiteSettings, deadline: Deadline) -> list[dict]:
    """Forward + backward of the whole model at each length: speed and peak memory against stock."""
    built = build_models(s, ("softmax", *s.long_presets), max(s.long_lengths) + 2)
    models = {name: built[name] for name in (STOCK, *s.long_presets)}
    rows = []
    for length in s.long_lengths:
        if not deadline.allows(5.0 if not s.dry_run else 0.0, f"long L={length}"):
            continue
        size, seconds, peaks, problems = fit_batch(s, models, length)
        fits = {name: models[name] for name in seconds}
        one_round = sum(seconds.values())
        repeats = max(1, min(s.long_repeats, int(deadline.left() // max(one_round, 1e-9))))
        if repeats < s.long_repeats:
            deadline.skipped.append(f"long L={length}: {repeats} of {s.long_repeats} rounds (time budget)")
        times = {}
        if STOCK in fits and deadline.allows(one_round, f"long L={length} timing"):
            batch = padded_batch(s.vocab, size, length, length, s.pad_fraction, s.device)
            step = lambda model, opt, batch=batch: forward_backward_bf16(model, batch)  # noqa: E731
            times = timed_rounds(s, step, fits, repeats, f"long L={length}", deadline)
        by_name = {r["preset"]: r for r in ratio_rows(times)} if times else {}
        for name in models:
            row = {"length": length, "preset": name, "batch": size, **by_name.get(name, {"preset": name})}
            row["peak_mib"] = peaks.get(name)
            row["mem_vs_stock"] = peaks[name] / peaks[STOCK] if name in peaks and peaks.get(STOCK) else None
            row["status"] = problems.get(name, "ok") + (" at batch 1" if problems.get(name) == "out of memory" else "")
            rows.append(row)
    free(built)
    return rows


def run_compiled(s: GpuSuiteSettings, deadline: Deadline) -> list[dict]:
    """Training steps of compiled models (``model.compile()``) against compiled stock, on the first batch."""
    if not s.compiled_presets or not deadline.allows(75.0 if not s.dry_run else 0.0, "compiled"):
        return []
    built = build_models(s, ("softmax", *s.compiled_presets), 512)
    try:
        return compiled_rows(s, {name: built[name] for name in (STOCK, *s.compiled_presets)}, deadline)
    except Exception as e:  # noqa: BLE001 - one GPU run should keep the other sections' results
        deadline.skipped.append(f"compiled: failed ({one_line(e)})")
        return []
    finally:
        free(built)
        torch._dynamo.reset()


def compiled_rows(s: GpuSuiteSettings, models: dict, deadline: Deadline) -> list[dict]:
    raise_recompile_limits(len(models))
    for model, _ in models.values():
        model.compile(backend=s.compile_backend)
    n, length = s.train_batches[0]
    batch = padded_batch(s.vocab, n, length, length, s.pad_fraction, s.device)
    step = lambda model, opt: train_step_bf16(model, opt, batch)  # noqa: E731
    warm = warm_up(s.device, step, models, compiled=True)
    times = timed_rounds(s, step, models, s.repeats, f"compiled train {n} x {length}", deadline)
    return ratio_rows(times, {name: {"warmup_s": warm[name], "sentences": n, "tokens": length} for name in models})


def run_gpu_suite(s: GpuSuiteSettings, command: str) -> dict:
    """The whole suite within ``s.budget_s``: the JSON `render_gpu_block` renders."""
    deadline = Deadline(s.budget_s)
    result = {"suite": "gpu", "settings": asdict(s), "environment": environment(s, command), "kernel_paths": {},
              "errors": {}}
    # shares of what is left: whatever a section does not use passes on to the next ones
    result["sentence"] = run_sentence(s, deadline.section(0.45), result["kernel_paths"], result["errors"])
    result["long"] = run_long(s, deadline.section(0.5))
    result["compiled"] = run_compiled(s, deadline)
    result["skipped"] = deadline.skipped
    result["budget_used_s"] = s.budget_s - deadline.left()
    return result
