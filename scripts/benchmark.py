#!/usr/bin/env python
"""Speed and memory of hf-attn presets against stock transformers with SDPA, measured in the same run.

The reference is the model a user would otherwise train: stock `MarianMTModel` (``--base bart``:
`BartForConditionalGeneration`) of the same sizes with ``attn_implementation="sdpa"``, holding the weights of the
hf-attn ``softmax`` model (same shapes), so both do identical work. hf-attn's own ``softmax`` preset is always
timed too and reported as a second column. For one model size, every model is timed on
  * a training step: forward + backward + AdamW step on `--batch` sentences of `--src-len`/`--tgt-len` tokens,
    a `--pad-fraction` of the rows padded (their source and target shortened to a random length >= half), and
  * beam-`--beams` decoding of `--decode-batch` sources of `--decode-src-len` tokens (padded likewise), forced to
    exactly `--decode-len` new tokens (every model does the same work, also with random weights).
Rounds are interleaved (stock, softmax, A, B, ..., then softmax, A, B, ..., stock: the order rotates by one each
round, so no model always runs first) and repeated; a ratio is the median
over rounds of t_reference / t_preset in that round (> 1 = faster than the reference). Peak memory is the growth
of the peak RSS during one training step, each model in a fresh subprocess (on CUDA: max_memory_allocated).
The defaults are the setting of issue 16 (small Marian, batch 32 x 30 with a quarter padded, beam-4 decoding of
16 x 24 tokens, 2 threads):

    python scripts/benchmark.py --repeats 5 --output runs/bench.json
    python scripts/benchmark.py --base bart --output runs/bench_bart.json

Long-sequence mode (`--long 512,1024,2048,4096`): forward + backward of the whole model on `--long-batch`
sequences of L source and L target tokens (no optimiser step) per length, interleaved rounds as above, the
peak memory of one forward + backward per model and length (a fresh subprocess each), and a plot (speed and
peak memory against L, stock SDPA the reference line) beside the JSON:

    python scripts/benchmark.py --presets reluformer --long 512,1024,2048,4096 --repeats 3 --output runs/bench_long.json

`--profile` also runs three calls of every model under torch.profiler and tabulates where each preset spends time
beyond stock: the extra operator self time (the operators with the largest extra first) and the extra time outside
the operators (Python, dispatch), per training step and decoding call (in `--long` mode: per length):

    python scripts/benchmark.py --presets rela-g,gmm --profile --output runs/bench_profile.json

`--compile` compiles every model in place, stock included (`model.compile()`, inductor unless a backend is named),
runs each path untimed until a pass over the models compiles nothing new (`warm_up`), then times compiled against
compiled: what a user who compiles both models would see. One preset (beside softmax) per run:

    python scripts/benchmark.py --presets gmm --compile --repeats 15 --output runs/bench_compiled.json

The Speed section of the documentation (`DOCS_PAGE`) is generated from such JSON files (the block between the
benchmark markers):

    python scripts/benchmark.py --docs docs/speed.md --from runs/bench.json runs/bench_long.json
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import json
import logging
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile
from torch.utils.flop_counter import FlopCounterMode
from tqdm.auto import tqdm
from transformers import BartConfig, BartForConditionalGeneration, MarianConfig, MarianMTModel

import hf_attn
from hf_attn.io_utils import replace_marked_block, write_json
from hf_attn.training.cpu_memory import proc_status_kib

STOCK = "stock-sdpa"  # the reference model's row name
DEFAULT_PRESETS = "softmax,sparsemax,entmax15,rela-g,gmm,ran-all,ran-d,calibration-gate"
BLOCK_START, BLOCK_END = "<!-- benchmark:start -->", "<!-- benchmark:end -->"
DOCS_PAGE = "docs/speed.md"  # the page that holds the generated block


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--presets", default=DEFAULT_PRESETS, help="comma list, or 'all' (softmax is always included)")
    p.add_argument("--base", choices=["marian", "bart"], default="marian")
    p.add_argument("--d-model", type=int, default=256)
    p.add_argument("--layers", type=int, default=3, help="encoder and decoder layers each")
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--ffn", type=int, default=1024)
    p.add_argument("--vocab", type=int, default=8000)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--src-len", type=int, default=30)
    p.add_argument("--tgt-len", type=int, default=30)
    p.add_argument("--pad-fraction", type=float, default=0.25, help="share of the rows that are padded")
    p.add_argument("--decode-batch", type=int, default=16)
    p.add_argument("--decode-src-len", type=int, default=24)
    p.add_argument("--decode-len", type=int, default=24, help="new tokens per decoded sentence")
    p.add_argument("--beams", type=int, default=4)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--no-memory", action="store_true", help="skip the per-model memory subprocesses")
    p.add_argument("--no-decode", action="store_true", help="time training steps only")
    p.add_argument("--compile", nargs="?", const="inductor", default=None, metavar="BACKEND",
                   help="compile every model in place, stock included (model.compile(backend=BACKEND), default "
                        "inductor), and time compiled against compiled, one preset beside softmax per run; the calls "
                        "that compile are not timed; no FLOP and memory columns")
    p.add_argument("--profile", action="store_true",
                   help="also profile three calls of every model (torch.profiler) and tabulate where each preset spends "
                        "time beyond stock: the operators with the largest extra self time, and the time outside them")
    p.add_argument("--output", default="runs/benchmark.json", help="JSON results (a .md table is written beside)")
    p.add_argument("--long", default=None, help="long-sequence mode: comma list of lengths, e.g. 512,1024,2048,4096")
    p.add_argument("--long-batch", type=int, default=2, help="sequences per forward/backward in --long mode")
    p.add_argument("--docs", dest="docs", nargs="?", const=DOCS_PAGE, default=None, metavar="PAGE",
                   help=f"rewrite the benchmark block of this page ({DOCS_PAGE} when no PAGE is given) from the --from "
                        "JSON files")
    p.add_argument("--from", dest="sources", nargs="+", default=None, help="benchmark JSON files for --docs")
    p.add_argument("--_memory-of", dest="memory_of", default=None, help=argparse.SUPPRESS)
    p.add_argument("--_memory-len", dest="memory_len", type=int, default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if (args.docs is None) != (args.sources is None):
        p.error(f"--docs {DOCS_PAGE} and --from RESULT.json ... go together")
    names = sorted(hf_attn.PRESETS) if args.presets == "all" else [x.strip() for x in args.presets.split(",") if x]
    for name in names:
        if name not in hf_attn.PRESETS:
            p.error(f"unknown preset {name!r}; valid presets: {sorted(hf_attn.PRESETS)}")
    args.presets = ["softmax"] + [n for n in names if n != "softmax"]
    if not 0 <= args.pad_fraction <= 1:
        p.error(f"--pad-fraction {args.pad_fraction}: must be in [0, 1], e.g. 0.25")
    if args.compile:
        backends = torch._dynamo.list_backends(exclude_tags=())
        if args.compile not in backends:
            p.error(f"--compile {args.compile!r}: not a torch.compile backend; use one of {backends}, e.g. inductor")
        if args.long is not None:
            p.error("--compile times the training step and beam search; leave it out with --long")
        if len(args.presets) > 2:
            p.error(f"--compile takes one preset beside softmax per run, not {len(args.presets) - 1} "
                    f"({','.join(args.presets[1:])}): the hf-attn models are one class and share dynamo's graph "
                    "caches, and with several presets in one run their calls ran well behind compiled stock; run the "
                    "script once per preset")
        args.no_memory = True  # (the memory subprocess would measure the eager model)
    if args.long is not None:
        try:
            args.long = [int(x) for x in str(args.long).split(",") if x.strip()]
        except ValueError:
            p.error(f"--long {args.long!r}: need a comma list of positive lengths, e.g. 512,1024,2048,4096")
        if not args.long or min(args.long) < 2:
            p.error(f"--long {args.long!r}: need a comma list of lengths >= 2, e.g. 512,1024,2048,4096")
    return args


# ---------------------------------------------------------------------------------------------------------------
# Models and batches
# ---------------------------------------------------------------------------------------------------------------
def sizes(args, max_len: int) -> dict:
    """The config fields shared by the stock and the hf-attn models."""
    return dict(
        vocab_size=args.vocab,
        d_model=args.d_model,
        encoder_layers=args.layers,
        decoder_layers=args.layers,
        encoder_attention_heads=args.heads,
        decoder_attention_heads=args.heads,
        encoder_ffn_dim=args.ffn,
        decoder_ffn_dim=args.ffn,
        max_position_embeddings=max(512, max_len),
        pad_token_id=1,
        eos_token_id=2,
        forced_eos_token_id=None,
        decoder_start_token_id=1 if args.base == "marian" else 2,
        bos_token_id=0,
    )


def max_len(args) -> int:
    return max([args.src_len, args.tgt_len, args.decode_src_len, args.decode_len + 2, *(args.long or [])])


def build(args, preset):
    """An hf-attn model of `preset` (seed 0) and its optimiser."""
    torch.manual_seed(0)
    config_cls = hf_attn.HfAttnMarianConfig if args.base == "marian" else hf_attn.HfAttnBartConfig
    model_cls = hf_attn.HfAttnMarianMTModel if args.base == "marian" else hf_attn.HfAttnBartForConditionalGeneration
    model = model_cls(config_cls.from_preset(preset, **sizes(args, max_len(args)))).to(args.device)
    return model, torch.optim.AdamW(model.parameters(), lr=1e-4)


def build_stock(args, reference=None):
    """Stock transformers with SDPA, of the same sizes, with the weights of `reference` (hf-attn softmax)."""
    config_cls, model_cls = (MarianConfig, MarianMTModel) if args.base == "marian" else (BartConfig, BartForConditionalGeneration)
    torch.manual_seed(0)
    model = model_cls._from_config(config_cls(**sizes(args, max_len(args))), attn_implementation="sdpa")
    if reference is None:
        reference = build(args, "softmax")[0]
    missing, unexpected = model.load_state_dict(reference.state_dict(), strict=False)
    if missing or unexpected:
        raise RuntimeError(f"stock model and hf-attn softmax differ in parameters: {missing} / {unexpected}")
    model.to(args.device)
    return model, torch.optim.AdamW(model.parameters(), lr=1e-4)


def build_named(args, name, reference=None):
    return build_stock(args, reference) if name == STOCK else build(args, name)


def make_batch(args, n, src_len, tgt_len=None):
    """Random ids; a `--pad-fraction` of the rows (every k-th) shortened to a random length >= half, padded right."""
    g = torch.Generator().manual_seed(n * 1000 + src_len)
    src = torch.randint(3, args.vocab, (n, src_len), generator=g)
    mask = torch.ones_like(src)
    labels = torch.randint(3, args.vocab, (n, tgt_len), generator=g) if tgt_len else None
    n_pad = round(n * args.pad_fraction)
    padded = torch.linspace(0, n - 1, n_pad).round().long().flip(0) if n_pad else torch.zeros(0, dtype=torch.long)
    for i in padded.tolist():
        keep = int(torch.randint(max(1, src_len // 2), src_len, (1,), generator=g)) if src_len > 1 else 1
        src[i, keep:], mask[i, keep:] = 1, 0
        if labels is not None and tgt_len > 1:
            labels[i, int(torch.randint(max(1, tgt_len // 2), tgt_len, (1,), generator=g)):] = -100
    src[torch.arange(n), mask.sum(1) - 1] = 2  # eos closes every source
    batch = {"input_ids": src, "attention_mask": mask}
    if labels is not None:
        batch["labels"] = labels
    return {k: v.to(args.device) for k, v in batch.items()}


def sync(args):
    if args.device.startswith("cuda"):
        torch.cuda.synchronize()


def train_step(model, optimizer, batch):
    model.train()
    loss = model(**batch).loss
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return loss.item()


@torch.no_grad()
def decode(args, model, batch):
    model.eval()
    return model.generate(
        **batch,
        num_beams=args.beams,
        max_new_tokens=args.decode_len,
        min_new_tokens=args.decode_len,
        do_sample=False,
        early_stopping=False,
    )


def timed(args, fn, *a):
    sync(args)
    start = time.perf_counter()
    fn(*a)
    sync(args)
    return time.perf_counter() - start


def rounds(args, items, desc: str):
    """The (name, model) pairs of each of the ``--repeats`` rounds, the order rotated by one per round."""
    items = list(items)
    for r in tqdm(range(args.repeats), desc=desc):
        k = r % len(items)
        yield items[k:] + items[:k]


def per_round(times: dict, name: str, reference: str = STOCK) -> list[float]:
    """The per-round speed ratios t_reference / t_name (> 1 = faster), one per interleaved round."""
    return [r / t for r, t in zip(times[reference], times[name])]


def ratios(times: dict, name: str) -> dict:
    """Median per-round speed ratios of `name` against the stock model and hf-attn softmax (> 1 = faster)."""
    return {ref: statistics.median(per_round(times, name, key))
            for ref, key in (("stock", STOCK), ("softmax", "softmax"))}


# ---------------------------------------------------------------------------------------------------------------
# Peak memory, each model in a fresh subprocess
# ---------------------------------------------------------------------------------------------------------------
def cpu_peak_growth_mib(fn, *a) -> float:
    """Peak RSS growth (MiB) while running ``fn(*a)``.

    ``ru_maxrss`` alone is wrong in a subprocess: Linux carries the parent's RSS at fork into the child's maxrss
    across exec, so a child of a big parent reports 0 growth. On Linux the peak (VmHWM) is reset first through
    /proc/self/clear_refs; elsewhere ``ru_maxrss`` is the fallback.
    """
    gc.collect()
    try:  # hand freed heap memory back first (e.g. the reference model the stock one copied its weights from)
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # reset VmHWM to the current RSS
        before = proc_status_kib("VmRSS")
    except OSError:
        before = None
    if before is not None:
        fn(*a)
        peak = proc_status_kib("VmHWM")
        return max(0, peak - before) / 1024
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    fn(*a)
    return (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024


def peak_growth_mib(args, fn, *a) -> float:
    if args.device.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
        fn(*a)
        return (torch.cuda.max_memory_allocated() - before) / 2**20
    return cpu_peak_growth_mib(fn, *a)


def peak_memory_mb(args) -> float:
    """In this (fresh) process: one training step (or, with `memory_len`, one forward + backward at that length)."""
    model, optimizer = build_named(args, args.memory_of)
    if args.memory_len:
        return peak_growth_mib(args, forward_backward, model, make_batch(args, args.long_batch, args.memory_len, args.memory_len))
    return peak_growth_mib(args, train_step, model, optimizer, make_batch(args, args.batch, args.src_len, args.tgt_len))


def memory_in_subprocess(name, argv, length=None) -> float | None:
    """Peak memory of model `name` measured by a fresh process; None (and a note) if that process fails."""
    cmd = [sys.executable, __file__, *argv, "--_memory-of", name] + (["--_memory-len", str(length)] if length else [])
    # glibc raises its mmap threshold after each large free (up to 32 MiB), so tensors below it come from the heap,
    # whose fragmentation counts in the RSS peak: a fixed threshold hands freed tensors back, the peak is live memory
    env = {**os.environ, "PYTHONWARNINGS": "ignore", "MALLOC_MMAP_THRESHOLD_": str(128 * 1024)}
    out = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if out.returncode != 0:  # e.g. out of memory: reported as missing, not a crash of the whole benchmark
        print(f"memory run of {name} (length {length}) failed: {out.stderr.strip().splitlines()[-1:]}", file=sys.stderr)
        return None
    return float(out.stdout.strip().splitlines()[-1])


# ---------------------------------------------------------------------------------------------------------------
# Sentence-level benchmark
# ---------------------------------------------------------------------------------------------------------------
def build_all(args) -> dict:
    """{name: (model, optimiser)}: stock first, then hf-attn softmax (whose weights the stock model holds), ..."""
    models = {}
    for name in tqdm(["softmax", *args.presets[1:]], desc="building models"):
        models[name] = build(args, name)
    return {STOCK: build_stock(args, models["softmax"][0]), **models}


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    if args.docs:
        return update_docs(Path(args.docs), [Path(s) for s in args.sources])
    torch.set_num_threads(args.threads)
    if args.memory_of:
        print(f"{peak_memory_mb(args):.1f}")
        return None
    if args.long:
        return long_main(args, argv)

    models = build_all(args)
    if args.compile:
        # hf-attn models of every preset are one class, so their forward functions share dynamo's per-function cache:
        # at its default limit (8 graphs) the later models would silently fall back to eager
        torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 16 * len(models))
        torch._dynamo.config.accumulated_recompile_limit = max(torch._dynamo.config.accumulated_recompile_limit,
                                                               64 * len(models))
        for model, _ in models.values():
            model.compile(backend=args.compile)
    fallbacks = RecompileLimitHits() if args.compile else None
    train_batch = make_batch(args, args.batch, args.src_len, args.tgt_len)
    decode_batch = make_batch(args, args.decode_batch, args.decode_src_len)
    kinds = ["train"] + ([] if args.no_decode else ["decode"])
    times = {k: {n: [] for n in models} for k in kinds}
    flops = {k: {} for k in kinds}
    warmup = {}  # seconds of the untimed first call(s) per model: with --compile, mostly compilation
    profiles = {k: {} for k in kinds}
    # training, then decoding, as a user runs them: decoding with fixed weights keeps what a variant derives from
    # them alone (RAN's attention matrices) from one call to the next
    steps = {"train": lambda model, opt: train_step(model, opt, train_batch),
             "decode": lambda model, opt: decode(args, model, decode_batch)}
    for kind in kinds:
        warmup[kind] = warm_up(args, steps[kind], models)  # untimed
        if not args.compile:  # the FLOPs of a second, warm call
            for name, (model, opt) in models.items():
                flops[kind][name] = matmul_flops(steps[kind], model, opt)
        for name, (model, opt) in models.items() if args.profile else [(STOCK, models[STOCK])]:
            profiles[kind][name] = op_profile(args, steps[kind], model, opt)
        for order in rounds(args, models.items(), f"{kind}: interleaved rounds"):
            for name, (model, opt) in order:
                times[kind][name].append(timed(args, steps[kind], model, opt))

    rows = []
    for name, (model, _) in models.items():
        row = {"preset": name, "params": sum(p.numel() for p in model.parameters())}
        for kind in kinds:
            row[f"{kind}_median_s"] = statistics.median(times[kind][name])
            row[f"{kind}_warmup_s"] = warmup[kind][name]
            for ref, value in ratios(times[kind], name).items():
                row[f"{kind}_ratio_vs_{ref}"] = value
            if flops[kind]:
                row[f"{kind}_flop_ratio_vs_stock"] = flops[kind][STOCK] / flops[kind][name]
            if name == STOCK:
                row[f"{kind}_attention_share"] = attention_share(profiles[kind][STOCK])
            if name in profiles[kind] and args.profile:
                row[f"{kind}_profile"] = profiles[kind][name]
        if not args.no_memory:
            row["train_peak_mem_mib"] = memory_in_subprocess(name, argv)
        rows.append(row)
    results = {"rows": rows, "times": times}
    if fallbacks is not None:
        results["compile_fallbacks"] = fallbacks.detach()
    return finish(args, argv, results, render_table(settings(args, argv), rows, times, results.get("compile_fallbacks")))


def warm_up(args, step, models: dict, max_passes: int = 5) -> dict:
    """Untimed calls of ``step`` on every model: one each, or with ``--compile`` passes over all models until a
    whole pass compiles no new graph (at most ``max_passes``): compiling one model can make dynamo recompile code
    the models share (shapes it marks dynamic), so one call per model is not enough. Returns {name: seconds}."""
    seconds = dict.fromkeys(models, 0.0)
    graphs = torch._dynamo.utils.counters["stats"]
    for _ in range(max_passes if args.compile else 1):
        before = graphs["unique_graphs"]
        for name, (model, opt) in models.items():
            seconds[name] += timed(args, step, model, opt)
        if graphs["unique_graphs"] == before:
            break
    return seconds


class RecompileLimitHits(logging.Handler):
    """Collects dynamo's "hit config.recompile_limit" warnings: each names a function that runs eagerly from then
    on, so the compiled timings would be partly eager. `detach()` stops collecting and returns their first lines."""

    def __init__(self):
        super().__init__(logging.WARNING)
        self.hits: list[str] = []
        self.logger = logging.getLogger("torch._dynamo.convert_frame")
        self.logger.addHandler(self)

    def emit(self, record):
        message = record.getMessage()
        if "recompile_limit" in message:
            self.hits.append(" ".join(message.split("\n")[:2]))

    def detach(self) -> list[str]:
        self.logger.removeHandler(self)
        super().close()
        return self.hits


def matmul_flops(fn, *a) -> int:
    """FLOPs of the matrix products (linear, matmul, SDPA) in ``fn(*a)``, counted by torch's FlopCounterMode: the
    ratio stock / preset is the speed a run bound by these products would reach."""
    counter = FlopCounterMode(display=False)
    counter.mod_tracker = _NoModuleTracker()  # totals only: its per-module hooks trip over RAN's cached matrices
    with counter:
        fn(*a)
    return counter.get_total_flops()


def op_profile(args, fn, *a, calls: int = 3, cut: float = 1e-3) -> dict:
    """``calls`` calls of ``fn(*a)`` under torch.profiler, per call: ``{"wall_s": seconds, "op_s": operator total,
    "ops": {operator: self seconds}}``, the operators' self time (CPU, or CUDA on a GPU), largest first; operators
    under ``cut`` (0.1%) of the total are left out. The wall time minus the operators' total is what runs outside them
    (Python, dispatch, the profiler itself)."""
    cuda = args.device.startswith("cuda")
    activities = [ProfilerActivity.CUDA] if cuda else [ProfilerActivity.CPU]
    with profile(activities=activities) as prof:
        start = time.perf_counter()
        for _ in range(calls):
            fn(*a)
        sync(args)
        wall = (time.perf_counter() - start) / calls
    time_of = (lambda e: e.self_device_time_total) if cuda else (lambda e: e.self_cpu_time_total)
    events = prof.key_averages()
    ops = {e.key: time_of(e) / 1e6 / calls for e in events}
    total = sum(ops.values())
    kept = sorted(((k, v) for k, v in ops.items() if v >= cut * total and v > 0), key=lambda kv: -kv[1])
    # operator calls (nested ones too, e.g. aten::matmul and the aten::bmm inside it): each pays a dispatch
    op_calls = sum(e.count for e in events) / calls
    # the SDPA ops' time from every event, not the kept ones: on a tiny model one stall elsewhere can push SDPA
    # under the cut (`attention_share`)
    attention = sum(v for k, v in ops.items() if "scaled_dot_product" in k)
    return {"wall_s": wall, "op_s": total, "ops": dict(kept), "op_calls": op_calls, "attention_s": attention}


def attention_share(prof: dict) -> float:
    """The share of a profiled call's operator time spent in the SDPA ops (forward and backward). Measured on
    stock, it bounds what any attention variant can gain: one whose attention cost nothing would run at most
    1 / (1 - share) times as fast as stock (Python time outside the ops is left out of the total, so the bound is
    generous)."""
    attention = prof.get("attention_s")  # (profiles written before it was recorded: the kept operators)
    if attention is None:
        attention = sum(t for op, t in prof["ops"].items() if "scaled_dot_product" in op)
    return attention / prof["op_s"] if prof["op_s"] else 0.0


def extra_time(stock: dict, prof: dict, top: int = 4) -> dict:
    """Where a preset's profiled call spends time beyond stock's: the difference in wall time, in operator time
    and outside the operators, and the ``top`` operators with the largest extra self time (seconds)."""
    ops = set(stock["ops"]) | set(prof["ops"])
    delta = {op: prof["ops"].get(op, 0.0) - stock["ops"].get(op, 0.0) for op in ops}
    return {
        "wall_s": prof["wall_s"] - stock["wall_s"],
        "op_s": prof["op_s"] - stock["op_s"],
        "outside_s": (prof["wall_s"] - prof["op_s"]) - (stock["wall_s"] - stock["op_s"]),
        "top": sorted(((op, d) for op, d in delta.items() if d > 0), key=lambda kv: -kv[1])[:top],
    }


def render_profile_table(rows, kinds, label=lambda r: r["preset"]) -> str:
    """Markdown: per preset and kind, the profiled call's time against stock's and where the difference goes."""
    intro = ("Where the time goes: three profiled calls per model, per call (torch.profiler, operator self time; "
             "the profiler adds its own cost to every call); extra = preset - stock, in ms; outside ops = Python, "
             "dispatch and the profiler; operator calls = operators dispatched per call, nested ones included "
             "(stock -> preset)")
    lines = [intro, "",
             "| preset | call | stock ms | preset ms | extra in ops | extra outside ops | operator calls | "
             "largest extra ops (ms) |",
             "|---|---|---|---|---|---|---|---|"]
    stock_of = {r.get("length"): r for r in rows if r["preset"] == STOCK}
    for r in rows:
        stock = stock_of.get(r.get("length"))
        for kind in kinds:
            prof, ref = r.get(f"{kind}_profile"), stock and stock.get(f"{kind}_profile")
            if r["preset"] == STOCK or not prof or not ref:
                continue
            d = extra_time(ref, prof)
            top = ", ".join(f"{op} {1e3 * t:+.1f}" for op, t in d["top"]) or "-"
            calls = (f"{ref['op_calls']:,.0f} -> {prof['op_calls']:,.0f}" if "op_calls" in prof and "op_calls" in ref
                     else "-")  # (results written before the count)
            lines.append(f"| {label(r)} | {kind} | {1e3 * ref['wall_s']:.1f} | {1e3 * prof['wall_s']:.1f} | "
                         f"{1e3 * d['op_s']:+.1f} | {1e3 * d['outside_s']:+.1f} | {calls} | {top} |")
    return "\n".join(lines) if len(lines) > 4 else ""


class _NoModuleTracker:
    """Stands in for FlopCounterMode's module tracker: every FLOP is counted under "Global" only."""

    parents = {"Global"}

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def settings(args, argv) -> dict:
    out = {k: v for k, v in vars(args).items() if k not in ("memory_of", "memory_len", "docs", "sources")}
    return {**out, "command": "python scripts/benchmark.py " + " ".join(argv), "threads": torch.get_num_threads(),
            "torch": torch.__version__, "device_name": device_name(args.device)}


def device_name(device: str) -> str:
    if device.startswith("cuda"):
        return torch.cuda.get_device_name(torch.device(device))
    return f"CPU ({os.cpu_count()} cores)"


def finish(args, argv, results: dict, table: str) -> dict:
    results = {"settings": settings(args, argv), **results}
    print(table)
    out = Path(args.output)
    out.parent.mkdir(parents=True, exist_ok=True)
    write_json(out, results)
    out.with_suffix(".md").write_text(table + "\n", encoding="utf-8")
    print(f"wrote {out}")
    return results


def _x(value) -> str:
    return "-" if value is None else f"{value:.2f}x"


def _mib(value) -> str:
    return "failed" if value is None else f"{value:.0f}"


def model_description(s: dict) -> str:
    return (f"{s['base']} d_model={s['d_model']} layers={s['layers']}+{s['layers']} heads={s['heads']} "
            f"ffn={s['ffn']} vocab={s['vocab']}")


def ratio_quartiles(times: dict, name: str) -> tuple[float, float] | None:
    """The first and third quartiles of the per-round ratios t_stock / t_name (None under 2 rounds): how far the
    rounds scatter around the median on this machine."""
    rounds = per_round(times, name)
    if len(rounds) < 2:
        return None
    q1, _, q3 = statistics.quantiles(rounds, n=4, method="inclusive")
    return q1, q3


def render_table(s: dict, rows, times: dict | None = None, fallbacks: list[str] | None = None) -> str:
    """Markdown: the setting, then one row per model with its ratios against stock SDPA and hf-attn softmax; with
    the per-round ``times`` (``{kind: {name: [seconds]}}``), the quartiles of the ratios against stock too; with
    ``--compile``, a warning if dynamo fell back to eager anywhere (``fallbacks``, `RecompileLimitHits`)."""
    kinds = ["train"] + ([] if s["no_decode"] else ["decode"])
    head = (
        f"{model_description(s)}; train batch {s['batch']} x {s['src_len']}/{s['tgt_len']} tokens "
        f"({s['pad_fraction']:.0%} of rows padded); decode {s['decode_batch']} x {s['decode_src_len']} tokens, beam "
        f"{s['beams']}, {s['decode_len']} new tokens; {s['repeats']} interleaved rounds, median of per-round ratios "
        f"t_reference / t_preset (> 1 = faster); reference {STOCK} = stock {s['base']} with attn_implementation="
        f"\"sdpa\"; {s['device_name']}, {s['threads']} threads, torch {s['torch']}; "
    )
    if s.get("compile"):
        head += (f"every model, stock included, compiled in place with model.compile(backend=\"{s['compile']}\") "
                 "and timed after untimed passes over all models until one compiles nothing new")
        if fallbacks:
            head += (f". WARNING: dynamo hit its recompile limit {len(fallbacks)} time(s), so part of the timed work "
                     f"ran eagerly ({fallbacks[0]})")
    else:
        head += ("FLOP bound: the matrix-product FLOPs of stock / of the preset (torch's FlopCounterMode), the ratio a "
                 "run bound by those products would reach")
    stock = next((r for r in rows if r["preset"] == STOCK and "train_attention_share" in r), None)
    if stock is not None:  # what an attention variant can gain at all in this setting
        shares = [(kind, stock[f"{kind}_attention_share"]) for kind in kinds]
        head += (". Stock spends " + " and ".join(f"{share:.0%} of its {kind} time" for kind, share in shares)
                 + " in the SDPA ops (torch.profiler): an attention that cost nothing would run at most "
                 + " / ".join(f"{1 / (1 - share):.2f}x" for _, share in shares) + " as fast")
    if times:
        head += (". In brackets beside a ratio to stock: the first and third quartiles of the per-round ratios "
                 "(the rounds' scatter on this machine)")
    head += "\n"
    cols = ["preset"]
    for kind in kinds:
        cols += [f"{kind} vs stock SDPA", f"{kind} vs hf-attn softmax", f"{kind} s (median)"]
        cols += [f"{kind} untimed calls s (compiling)"] if s.get("compile") else [f"{kind} FLOP bound"]
    mem = "train_peak_mem_mib" in rows[0]
    cols += ["train peak mem MiB"] if mem else []
    lines = [head, "| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for r in rows:
        cells = [r["preset"]]
        for kind in kinds:
            spread = ratio_quartiles(times[kind], r["preset"]) if times and kind in times else None
            vs_stock = _x(r[f"{kind}_ratio_vs_stock"]) + (
                f" ({spread[0]:.2f}-{spread[1]:.2f})" if spread and r["preset"] != STOCK else "")
            cells += [vs_stock, _x(r[f"{kind}_ratio_vs_softmax"]), f"{r[f'{kind}_median_s']:.3f}"]
            warm = r.get(f"{kind}_warmup_s")  # (results written before it was recorded: "-")
            cells += [f"{warm:.0f}" if warm is not None else "-"] if s.get("compile") else [_x(r.get(f"{kind}_flop_ratio_vs_stock"))]
        cells += [_mib(r["train_peak_mem_mib"])] if mem else []
        lines.append("| " + " | ".join(cells) + " |")
    profiles = render_profile_table(rows, kinds)
    return "\n".join(lines) + ("\n\n" + profiles if profiles else "")


# ---------------------------------------------------------------------------------------------------------------
# Long-sequence mode
# ---------------------------------------------------------------------------------------------------------------
def forward_backward(model, batch):
    model.train()
    loss = model(**batch).loss
    loss.backward()
    model.zero_grad(set_to_none=True)
    return loss.item()


def long_main(args, argv):
    """Forward + backward time and peak memory per model and input length (interleaved, median ratios), a plot."""
    models = {name: model for name, (model, _) in build_all(args).items()}
    rows = []
    for length in args.long:
        batch = make_batch(args, args.long_batch, length, length)
        for model in models.values():  # warm-up, not timed
            forward_backward(model, batch)
        profiles = {name: op_profile(args, forward_backward, model, batch)
                    for name, model in models.items()} if args.profile else {}
        times = {n: [] for n in models}
        for order in rounds(args, models.items(), f"length {length}: interleaved rounds"):
            for name, model in order:
                times[name].append(timed(args, forward_backward, model, batch))
        for name in models:
            r = ratios(times, name)
            rows.append({
                "length": length,
                "preset": name,
                "fwd_bwd_median_s": statistics.median(times[name]),
                "fwd_bwd_ratio_vs_stock": r["stock"],
                "fwd_bwd_ratio_vs_softmax": r["softmax"],
                "tokens_per_s": 2 * length * args.long_batch / statistics.median(times[name]),
                "peak_mem_mib": None if args.no_memory else memory_in_subprocess(name, argv, length),
                **({"fwd_bwd_profile": profiles[name]} if name in profiles else {}),
            })
    results = finish(args, argv, {"long_rows": rows}, render_long_table(settings(args, argv), rows))
    plot = Path(args.output).with_suffix(".png")
    plot_long(rows, plot, model_description(results["settings"]))
    print(f"wrote {plot}")
    return results


def render_long_table(s: dict, rows) -> str:
    head = (
        f"{model_description(s)}; forward + backward of {s['long_batch']} sequences of L source + L target tokens; "
        f"{s['repeats']} interleaved rounds, median of per-round ratios t_reference / t_preset (> 1 = faster); peak "
        f"memory = growth during one forward + backward, a fresh process per model and length; reference {STOCK} = "
        f"stock {s['base']} with attn_implementation=\"sdpa\"; {s['device_name']}, {s['threads']} threads\n"
    )
    cols = ["L", "preset", "vs stock SDPA", "vs hf-attn softmax", "fwd+bwd s (median)", "tokens/s", "peak mem MiB",
            "mem vs stock"]
    lines = [head, "| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    stock_mem = {r["length"]: r["peak_mem_mib"] for r in rows if r["preset"] == STOCK}
    for r in rows:
        m, m0 = r["peak_mem_mib"], stock_mem.get(r["length"])
        lines.append("| " + " | ".join([
            str(r["length"]), r["preset"], _x(r["fwd_bwd_ratio_vs_stock"]), _x(r["fwd_bwd_ratio_vs_softmax"]),
            f"{r['fwd_bwd_median_s']:.3f}", f"{r['tokens_per_s']:.0f}", "-" if m is None and m0 is None else _mib(m),
            _x(m / m0 if m is not None and m0 else None),
        ]) + " |")
    profiles = render_profile_table(rows, ["fwd_bwd"], label=lambda r: f"{r['preset']} (L={r['length']})")
    return "\n".join(lines) + ("\n\n" + profiles if profiles else "")


def plot_long(rows, path: Path, title: str) -> None:
    """Speed vs stock SDPA and peak memory against input length, stock SDPA the reference line."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    names = list(dict.fromkeys(r["preset"] for r in rows))
    fig, (ax_speed, ax_mem) = plt.subplots(1, 2, figsize=(11, 4.2))
    for name in names:
        own = [r for r in rows if r["preset"] == name]
        lengths = [r["length"] for r in own]
        style = dict(color="black", linestyle="--", linewidth=2) if name == STOCK else dict(marker="o")
        ax_speed.plot(lengths, [r["fwd_bwd_ratio_vs_stock"] for r in own], label=name, **style)
        mem = [(r["length"], r["peak_mem_mib"]) for r in own if r["peak_mem_mib"] is not None]
        if mem:
            ax_mem.plot(*zip(*mem), label=name, **style)
    ax_speed.set(xscale="log", xlabel="input length L (source = target)", ylabel="speed vs stock SDPA (> 1 = faster)",
                 title="forward + backward speed")
    ax_mem.set(xscale="log", yscale="log", xlabel="input length L (source = target)", ylabel="peak memory growth (MiB)",
               title="peak memory of one forward + backward")
    for ax in (ax_speed, ax_mem):
        ax.set_xticks(sorted({r["length"] for r in rows}), labels=[str(x) for x in sorted({r["length"] for r in rows})])
        ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())  # the log axis' own labels would overlap
        ax.grid(alpha=0.3)
    ax_speed.legend(fontsize=8)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


# ---------------------------------------------------------------------------------------------------------------
# The documentation's Speed block (DOCS_PAGE), generated from benchmark JSON files
# ---------------------------------------------------------------------------------------------------------------
def docs_block(sources: list[Path]) -> str:
    """The Markdown between the benchmark markers of `DOCS_PAGE`: per JSON file its command and table."""
    parts = [f"Generated by `python scripts/benchmark.py --docs {DOCS_PAGE} --from "
             + " ".join(p.as_posix() for p in sources) + "` from these runs:"]
    for path in sources:
        try:
            result = json.loads(path.read_text(encoding="utf-8"))
            s = result["settings"]
            table = (render_long_table(s, result["long_rows"]) if "long_rows" in result
                     else render_table(s, result["rows"], result.get("times"), result.get("compile_fallbacks")))
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise SystemExit(f"benchmark: {path} is not a benchmark result ({type(e).__name__}: {e}); pass the JSON "
                             "that scripts/benchmark.py --output wrote")
        parts += ["", "```bash", s["command"], "```", "", table]
    return "\n".join(parts)


def update_docs(page: Path, sources: list[Path]) -> str:
    """Replace the page's block between the benchmark markers with `docs_block(sources)`."""
    body = docs_block(sources)
    if not replace_marked_block(page, BLOCK_START, BLOCK_END, body):
        raise SystemExit(f"benchmark: {page} has no block between {BLOCK_START} and {BLOCK_END}; add the two "
                         "marker lines where the tables belong")
    print(f"updated the benchmark block of {page}")
    return body


if __name__ == "__main__":
    main()
