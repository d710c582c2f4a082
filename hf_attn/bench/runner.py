"""The benchmark's two modes, run: sentence-level (a training step and a beam search per model) and long-sequence
(a forward + backward per model and input length), every model against stock transformers with SDPA holding the
hf-attn softmax model's weights, in interleaved rounds; peak memory per model in a fresh process."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from dataclasses import asdict, replace
from pathlib import Path

import torch
from tqdm.auto import tqdm

from ..io_utils import write_json
from .memory import peak_growth_mib
from .models import build_hf_attn, build_stock, config_fields, padded_batch
from .profile import attention_share, matmul_flops, op_profile
from .render import plot_long, render_result
from .results import STOCK, BenchmarkResult, BenchSettings, CallTiming, LongRow, SentenceRow
from .timing import (RecompileLimitHits, decode, forward_backward, interleaved, raise_recompile_limits, ratios,
                     train_step, warm_up)

PACKAGE_ROOT = Path(__file__).resolve().parents[2]  # the folder holding hf_attn, for the memory subprocesses


def model_fields(s: BenchSettings) -> dict:
    return config_fields(s.base, s.d_model, s.layers, s.heads, s.ffn, s.vocab, max(512, s.max_len))


def build_preset(s: BenchSettings, preset: str):
    """An hf-attn model of ``preset`` (seed 0) and its optimiser."""
    model = build_hf_attn(s.base, preset, model_fields(s), seed=0, device=s.device)
    return model, torch.optim.AdamW(model.parameters(), lr=1e-4)


def build_reference(s: BenchSettings, softmax_model):
    """The stock model holding ``softmax_model``'s weights, and its optimiser."""
    model = build_stock(s.base, model_fields(s), softmax_model, device=s.device)
    return model, torch.optim.AdamW(model.parameters(), lr=1e-4)


def build_named(s: BenchSettings, name: str):
    """The model ``name`` (a preset, or `STOCK`) and its optimiser, built alone (for a memory process)."""
    if name == STOCK:
        return build_reference(s, build_preset(s, "softmax")[0])
    return build_preset(s, name)


def build_all(s: BenchSettings) -> dict:
    """{name: (model, optimiser)}: stock first, then hf-attn softmax (whose weights the stock model holds), ..."""
    models = {}
    for name in tqdm(s.presets, desc="building models"):
        models[name] = build_preset(s, name)
    return {STOCK: build_reference(s, models["softmax"][0]), **models}


def train_batch(s: BenchSettings) -> dict:
    return padded_batch(s.vocab, s.batch, s.src_len, s.tgt_len, s.pad_fraction, s.device)


def decode_batch(s: BenchSettings) -> dict:
    return padded_batch(s.vocab, s.decode_batch, s.decode_src_len, None, s.pad_fraction, s.device)


def long_batch(s: BenchSettings, length: int) -> dict:
    return padded_batch(s.vocab, s.long_batch, length, length, s.pad_fraction, s.device)


def device_name(device: str) -> str:
    if device.startswith("cuda"):
        return torch.cuda.get_device_name(torch.device(device))
    return f"CPU ({os.cpu_count()} cores)"


def _result(s: BenchSettings, command: str, **rows) -> BenchmarkResult:
    return BenchmarkResult(settings=replace(s, threads=torch.get_num_threads()), command=command,
                           torch_version=torch.__version__, device_name=device_name(s.device), **rows)


# ---------------------------------------------------------------------------------------------------------------
# Peak memory, each model in a fresh process
# ---------------------------------------------------------------------------------------------------------------
def peak_memory_mib(s: BenchSettings, name: str, length: int | None = None) -> float:
    """In this (fresh) process: the peak memory growth of one training step of model ``name`` (with ``length``: one
    forward + backward at that input length)."""
    model, optimizer = build_named(s, name)
    if length:
        return peak_growth_mib(s.device, forward_backward, model, long_batch(s, length))
    return peak_growth_mib(s.device, train_step, model, optimizer, train_batch(s))


# the measuring process: settings (JSON), model name and length (0: a training step) on its command line
_MEMORY_PROCESS = ("import json, sys, torch; from hf_attn.bench.results import BenchSettings; "
                   "from hf_attn.bench.runner import peak_memory_mib; "
                   "s = BenchSettings.from_json(json.loads(sys.argv[1])); torch.set_num_threads(s.threads); "
                   "print(f'{peak_memory_mib(s, sys.argv[2], int(sys.argv[3])):.1f}')")


def memory_in_subprocess(s: BenchSettings, name: str, length: int | None = None) -> float | None:
    """Peak memory of model ``name`` measured by a fresh process; None (and a note) if that process fails."""
    cmd = [sys.executable, "-c", _MEMORY_PROCESS, json.dumps(asdict(s)), name, str(length or 0)]
    # glibc raises its mmap threshold after each large free (up to 32 MiB), so tensors below it come from the heap,
    # whose fragmentation counts in the RSS peak: a fixed threshold hands freed tensors back, the peak is live memory
    env = {**os.environ, "PYTHONWARNINGS": "ignore", "MALLOC_MMAP_THRESHOLD_": str(128 * 1024),
           "PYTHONPATH": os.pathsep.join([str(PACKAGE_ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])}
    out = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if out.returncode != 0:  # e.g. out of memory: reported as missing, not a crash of the whole benchmark
        print(f"memory run of {name} (length {length}) failed: {out.stderr.strip().splitlines()[-1:]}", file=sys.stderr)
        return None
    return float(out.stdout.strip().splitlines()[-1])


# ---------------------------------------------------------------------------------------------------------------
# The two modes
# ---------------------------------------------------------------------------------------------------------------
def run_sentence(s: BenchSettings, command: str) -> BenchmarkResult:
    """Every model timed on a training step and (unless ``no_decode``) a beam search in interleaved rounds; FLOP
    bounds (eager), stock's SDPA share, profiles (``profile``), peak memory (unless ``no_memory``)."""
    models = build_all(s)
    if s.compile:
        raise_recompile_limits(len(models))
        for model, _ in models.values():
            model.compile(backend=s.compile)
    fallbacks = RecompileLimitHits() if s.compile else None
    train, dec = train_batch(s), decode_batch(s)
    times = {}
    flops = {call: {} for call in s.calls}
    warmup = {}  # seconds of the untimed first call(s) per model: compiled, mostly compilation
    profiles = {call: {} for call in s.calls}
    # training, then decoding, as a user runs them: decoding with fixed weights keeps what a variant derives from
    # them alone (RAN's attention matrices) from one call to the next
    steps = {"train": lambda model, opt: train_step(model, opt, train),
             "decode": lambda model, opt: decode(model, dec, s.beams, s.decode_len)}
    for call in s.calls:
        warmup[call] = warm_up(s.device, steps[call], models, compiled=bool(s.compile))  # untimed
        if not s.compile:  # the FLOPs of a second, warm call
            for name, (model, opt) in models.items():
                flops[call][name] = matmul_flops(steps[call], model, opt)
        for name, (model, opt) in models.items() if s.profile else [(STOCK, models[STOCK])]:
            profiles[call][name] = op_profile(s.device, steps[call], model, opt)
        times[call] = interleaved(s.device, steps[call], models, s.repeats, f"{call}: interleaved rounds")

    rows = []
    for name, (model, _) in models.items():
        calls = {}
        for call in s.calls:
            r = ratios(times[call], name)
            calls[call] = CallTiming(
                median_s=statistics.median(times[call][name]), ratio_vs_stock=r["stock"], ratio_vs_softmax=r["softmax"],
                warmup_s=warmup[call][name],
                flop_ratio_vs_stock=flops[call][STOCK] / flops[call][name] if flops[call] else None,
                attention_share=attention_share(profiles[call][STOCK]) if name == STOCK else None,
                profile=profiles[call].get(name) if s.profile else None)
        memory = None if s.no_memory else memory_in_subprocess(s, name)
        rows.append(SentenceRow(name, calls, sum(p.numel() for p in model.parameters()), memory))
    return _result(s, command, rows=tuple(rows), times=times,
                   compile_fallbacks=None if fallbacks is None else fallbacks.detach())


def run_long(s: BenchSettings, command: str) -> BenchmarkResult:
    """Forward + backward time and peak memory per model and input length (interleaved, median ratios)."""
    models = {name: model for name, (model, _) in build_all(s).items()}
    rows = []
    for length in s.long:
        batch = long_batch(s, length)
        for model in models.values():  # warm-up, not timed
            forward_backward(model, batch)
        profiles = {name: op_profile(s.device, forward_backward, model, batch)
                    for name, model in models.items()} if s.profile else {}
        times = interleaved(s.device, lambda model, _: forward_backward(model, batch),
                            {name: (model, None) for name, model in models.items()}, s.repeats,
                            f"length {length}: interleaved rounds")
        for name in models:
            r, median = ratios(times, name), statistics.median(times[name])
            timing = CallTiming(median_s=median, ratio_vs_stock=r["stock"], ratio_vs_softmax=r["softmax"],
                                profile=profiles.get(name))
            rows.append(LongRow(length, name, timing, 2 * length * s.long_batch / median,
                                None if s.no_memory else memory_in_subprocess(s, name, length)))
    return _result(s, command, long_rows=tuple(rows))


def run(s: BenchSettings, command: str) -> BenchmarkResult:
    """The long-sequence mode if ``s.long`` names lengths, else the sentence-level one."""
    return run_long(s, command) if s.long is not None else run_sentence(s, command)


def save_result(result: BenchmarkResult, output: Path) -> list[Path]:
    """The JSON at ``output``, its table beside it (.md) and, long-sequence, the plot (.png); the paths written."""
    output.parent.mkdir(parents=True, exist_ok=True)
    write_json(output, result.to_json())
    output.with_suffix(".md").write_text(render_result(result) + "\n", encoding="utf-8")
    written = [output, output.with_suffix(".md")]
    if result.is_long:
        plot_long(result, output.with_suffix(".png"))
        written.append(output.with_suffix(".png"))
    return written
