#!/usr/bin/env python
"""Speed and memory of attention presets against the `softmax` preset (SDPA), measured in the same run.

For one model size, every preset is timed on
  * a training step: forward + backward + AdamW step on a batch of `--batch` sentences of `--src-len`/`--tgt-len`
    tokens, and
  * beam-`--beams` decoding of `--decode-batch` sentences, forced to exactly `--decode-len` new tokens (so every
    preset does the same work even with random weights).
Rounds are interleaved (softmax, A, B, ..., softmax, A, B, ...) and repeated; the ratio of a preset is the median
over rounds of t_softmax / t_preset in that round (> 1 = faster than softmax, the papers' convention, e.g. ReLA-g
0.93x train). Peak memory is the growth of the process' peak RSS during one training step, each preset measured
in a fresh subprocess (on CUDA: torch.cuda.max_memory_allocated).

    python scripts/benchmark.py --presets softmax,rela-g,sparsemax --repeats 5 --output runs/bench.json

Long-sequence mode (`--long 128,256,512,1024,2048`): for each length L, forward + backward of the whole model on
`--long-batch` sequences of L source and L target tokens (no optimiser step), interleaved rounds as above, the
median ratio t_softmax / t_preset per length, and the peak memory growth of one forward + backward per preset and
length (a fresh subprocess each):

    python scripts/benchmark.py --presets softmax,reluformer --long 128,256,512,1024,2048 --repeats 3 --output runs/bench_long.json
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time

import torch
from tqdm.auto import tqdm

import hf_attn


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--presets", default="softmax,sparsemax,entmax15,rela-i,rela-g", help="comma list, or 'all'")
    p.add_argument("--base", choices=["marian", "bart"], default="marian")
    p.add_argument("--d-model", type=int, default=256)
    p.add_argument("--layers", type=int, default=3, help="encoder and decoder layers each")
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--ffn", type=int, default=1024)
    p.add_argument("--vocab", type=int, default=8000)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--src-len", type=int, default=30)
    p.add_argument("--tgt-len", type=int, default=30)
    p.add_argument("--decode-batch", type=int, default=32)
    p.add_argument("--decode-len", type=int, default=30)
    p.add_argument("--beams", type=int, default=4)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--no-memory", action="store_true", help="skip the per-preset memory subprocesses")
    p.add_argument("--no-decode", action="store_true", help="time training steps only")
    p.add_argument("--output", default="runs/benchmark.json", help="JSON results (a .md table is written beside)")
    p.add_argument("--long", default=None, help="long-sequence mode: comma list of lengths, e.g. 128,256,512,1024,2048")
    p.add_argument("--long-batch", type=int, default=2, help="sequences per forward/backward in --long mode")
    p.add_argument("--_memory-of", dest="memory_of", default=None, help=argparse.SUPPRESS)
    p.add_argument("--_memory-len", dest="memory_len", type=int, default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    names = sorted(hf_attn.PRESETS) if args.presets == "all" else [x.strip() for x in args.presets.split(",") if x]
    for name in names:
        if name not in hf_attn.PRESETS:
            p.error(f"unknown preset {name!r}; valid presets: {sorted(hf_attn.PRESETS)}")
    args.presets = ["softmax"] + [n for n in names if n != "softmax"]
    if args.long is not None:
        try:
            args.long = [int(x) for x in str(args.long).split(",") if x.strip()]
        except ValueError:
            p.error(f"--long {args.long!r}: need a comma list of positive lengths, e.g. 128,256,512,1024,2048")
        if not args.long or min(args.long) < 2:
            p.error(f"--long {args.long!r}: need a comma list of lengths >= 2, e.g. 128,256,512,1024,2048")
    return args


def build(args, preset):
    torch.manual_seed(0)
    config_cls = hf_attn.HfAttnMarianConfig if args.base == "marian" else hf_attn.HfAttnBartConfig
    model_cls = hf_attn.HfAttnMarianMTModel if args.base == "marian" else hf_attn.HfAttnBartForConditionalGeneration
    config = config_cls.from_preset(
        preset,
        vocab_size=args.vocab,
        d_model=args.d_model,
        encoder_layers=args.layers,
        decoder_layers=args.layers,
        encoder_attention_heads=args.heads,
        decoder_attention_heads=args.heads,
        encoder_ffn_dim=args.ffn,
        decoder_ffn_dim=args.ffn,
        max_position_embeddings=max(512, args.src_len, args.tgt_len, args.decode_len + 2),
        pad_token_id=1,
        eos_token_id=2,
        forced_eos_token_id=None,
        decoder_start_token_id=1 if args.base == "marian" else 2,
        bos_token_id=0,
    )
    model = model_cls(config).to(args.device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    return model, optimizer


def make_batch(args, n, src_len, tgt_len=None):
    g = torch.Generator().manual_seed(n * 1000 + src_len)
    src = torch.randint(3, args.vocab, (n, src_len), generator=g)
    src[:, -1] = 2
    batch = {"input_ids": src, "attention_mask": torch.ones_like(src)}
    if tgt_len:
        batch["labels"] = torch.randint(3, args.vocab, (n, tgt_len), generator=g)
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


def _proc_status_kib(field: str) -> int | None:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def cpu_peak_growth_mib(fn, *a) -> float:
    """Peak RSS growth (MiB) while running ``fn(*a)``.

    ``ru_maxrss`` alone is wrong in a subprocess: Linux carries the parent's RSS at fork into the child's maxrss
    across exec, so a child of a big parent reports 0 growth. On Linux the peak (VmHWM) is reset first through
    /proc/self/clear_refs; elsewhere ``ru_maxrss`` is the fallback.
    """
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # reset VmHWM to the current RSS
        before = _proc_status_kib("VmRSS")
    except OSError:
        before = None
    if before is not None:
        fn(*a)
        peak = _proc_status_kib("VmHWM")
        return max(0, peak - before) / 1024
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    fn(*a)
    return (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024


def peak_memory_mb(args) -> float:
    """One training step of `args.memory_of` in this (fresh) process: peak memory growth in MiB."""
    model, optimizer = build(args, args.memory_of)
    batch = make_batch(args, args.batch, args.src_len, args.tgt_len)
    if args.device.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
        train_step(model, optimizer, batch)
        return (torch.cuda.max_memory_allocated() - before) / 2**20
    return cpu_peak_growth_mib(train_step, model, optimizer, batch)


def memory_in_subprocess(args, preset, argv) -> float:
    cmd = [sys.executable, __file__, *argv, "--_memory-of", preset]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True, env={**os.environ, "PYTHONWARNINGS": "ignore"})
    return float(out.stdout.strip().splitlines()[-1])


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    if args.memory_of and args.memory_len:
        print(f"{long_peak_memory_mb(args):.1f}")
        return None
    if args.memory_of:
        print(f"{peak_memory_mb(args):.1f}")
        return None
    if args.long:
        return long_main(args, argv)

    models = {name: build(args, name) for name in tqdm(args.presets, desc="building models")}
    train_batch = make_batch(args, args.batch, args.src_len, args.tgt_len)
    decode_batch = make_batch(args, args.decode_batch, args.src_len)
    kinds = ["train"] + ([] if args.no_decode else ["decode"])
    times = {k: {n: [] for n in args.presets} for k in kinds}
    for name, (model, opt) in models.items():  # warm-up round, not timed
        train_step(model, opt, train_batch)
        if not args.no_decode:
            decode(args, model, decode_batch)
    for _ in tqdm(range(args.repeats), desc="interleaved rounds"):
        for name, (model, opt) in models.items():
            times["train"][name].append(timed(args, train_step, model, opt, train_batch))
            if not args.no_decode:
                times["decode"][name].append(timed(args, decode, args, model, decode_batch))

    results = {"settings": {k: v for k, v in vars(args).items() if k != "memory_of"}, "torch": torch.__version__}
    results["threads"] = torch.get_num_threads()
    rows = []
    for name in args.presets:
        row = {"preset": name, "params": sum(p.numel() for p in models[name][0].parameters())}
        for kind in kinds:
            ratios = [s / t for s, t in zip(times[kind]["softmax"], times[kind][name])]
            row[f"{kind}_median_s"] = statistics.median(times[kind][name])
            row[f"{kind}_ratio_vs_softmax"] = statistics.median(ratios)
        if not args.no_memory:
            row["train_peak_mem_mib"] = memory_in_subprocess(args, name, [a for a in argv if a])
        rows.append(row)
    results["rows"] = rows
    table = render_table(args, rows, kinds)
    print(table)
    os.makedirs(os.path.dirname(os.path.abspath(args.output)), exist_ok=True)
    with open(args.output, "w") as f:
        json.dump(results, f, indent=2)
    with open(os.path.splitext(args.output)[0] + ".md", "w") as f:
        f.write(table + "\n")
    print(f"wrote {args.output}")
    return results


def render_table(args, rows, kinds) -> str:
    head = (
        f"{args.base} d_model={args.d_model} layers={args.layers}+{args.layers} heads={args.heads} ffn={args.ffn} "
        f"vocab={args.vocab}; train batch {args.batch}x{args.src_len}/{args.tgt_len}; decode {args.decode_batch} "
        f"sentences, beam {args.beams}, {args.decode_len} tokens; {args.repeats} interleaved rounds, median ratio "
        f"t_softmax/t_preset (>1 = faster); device {args.device}, {torch.get_num_threads()} threads\n"
    )
    cols = ["preset", "params"]
    for kind in kinds:
        cols += [f"{kind} s (median)", f"{kind} speed vs softmax"]
    if "train_peak_mem_mib" in rows[0]:
        cols.append("train peak mem MiB")
    lines = [head, "| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for r in rows:
        cells = [r["preset"], f"{r['params'] / 1e6:.2f}M"]
        for kind in kinds:
            cells += [f"{r[f'{kind}_median_s']:.3f}", f"{r[f'{kind}_ratio_vs_softmax']:.2f}x"]
        if "train_peak_mem_mib" in r:
            cells.append(f"{r['train_peak_mem_mib']:.0f}")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------------------------
# Long-sequence mode
# ---------------------------------------------------------------------------------------------------------------
def long_args(args, length):
    """`args` with source/target length `length` (position tables sized for the longest length)."""
    ns = argparse.Namespace(**vars(args))
    ns.src_len = ns.tgt_len = length
    return ns


def forward_backward(model, batch):
    model.train()
    loss = model(**batch).loss
    loss.backward()
    model.zero_grad(set_to_none=True)
    return loss.item()


def long_peak_memory_mb(args) -> float:
    """One forward + backward of `args.memory_of` at length `args.memory_len`, in this (fresh) process (MiB)."""
    model, _ = build(long_args(args, max(args.long)), args.memory_of)
    batch = make_batch(args, args.long_batch, args.memory_len, args.memory_len)
    if args.device.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
        forward_backward(model, batch)
        return (torch.cuda.max_memory_allocated() - before) / 2**20
    return cpu_peak_growth_mib(forward_backward, model, batch)


def long_memory_in_subprocess(preset, length, argv) -> float | None:
    cmd = [sys.executable, __file__, *argv, "--_memory-of", preset, "--_memory-len", str(length)]
    out = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "PYTHONWARNINGS": "ignore"})
    if out.returncode != 0:  # e.g. out of memory: reported as missing, not a crash of the whole benchmark
        print(f"memory run of {preset} at {length} failed: {out.stderr.strip().splitlines()[-1:]}", file=sys.stderr)
        return None
    return float(out.stdout.strip().splitlines()[-1])


def long_main(args, argv):
    """Forward + backward time and peak memory per preset and input length (interleaved, median ratios)."""
    models = {name: build(long_args(args, max(args.long)), name)[0] for name in tqdm(args.presets, desc="building models")}
    rows = []
    for length in args.long:
        batch = make_batch(args, args.long_batch, length, length)
        for model in models.values():  # warm-up, not timed
            forward_backward(model, batch)
        times = {n: [] for n in args.presets}
        for _ in tqdm(range(args.repeats), desc=f"length {length}: interleaved rounds"):
            for name, model in models.items():
                times[name].append(timed(args, forward_backward, model, batch))
        for name in args.presets:
            ratios = [s / t for s, t in zip(times["softmax"], times[name])]
            row = {
                "length": length,
                "preset": name,
                "fwd_bwd_median_s": statistics.median(times[name]),
                "fwd_bwd_ratio_vs_softmax": statistics.median(ratios),
                "tokens_per_s": 2 * length * args.long_batch / statistics.median(times[name]),
            }
            if not args.no_memory:
                row["peak_mem_mib"] = long_memory_in_subprocess(name, length, [a for a in argv if a])
            rows.append(row)
    results = {"settings": {k: v for k, v in vars(args).items() if k not in ("memory_of", "memory_len")},
               "torch": torch.__version__, "threads": torch.get_num_threads(), "long_rows": rows}
    table = render_long_table(args, rows)
    print(table)
    os.makedirs(os.path.dirname(os.path.abspath(args.output)), exist_ok=True)
    with open(args.output, "w") as f:
        json.dump(results, f, indent=2)
    with open(os.path.splitext(args.output)[0] + ".md", "w") as f:
        f.write(table + "\n")
    print(f"wrote {args.output}")
    return results


def render_long_table(args, rows) -> str:
    head = (
        f"{args.base} d_model={args.d_model} layers={args.layers}+{args.layers} heads={args.heads} ffn={args.ffn} "
        f"vocab={args.vocab}; forward + backward of {args.long_batch} sequences of L source + L target tokens; "
        f"{args.repeats} interleaved rounds, median ratio t_softmax/t_preset (>1 = faster); peak memory = growth "
        f"during one forward + backward; device {args.device}, {torch.get_num_threads()} threads\n"
    )
    mem = not args.no_memory
    cols = ["L", "preset", "fwd+bwd s (median)", "speed vs softmax", "tokens/s"] + (["peak mem MiB", "mem vs softmax"] if mem else [])
    lines = [head, "| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    soft_mem = {r["length"]: r.get("peak_mem_mib") for r in rows if r["preset"] == "softmax"}
    for r in rows:
        cells = [str(r["length"]), r["preset"], f"{r['fwd_bwd_median_s']:.3f}", f"{r['fwd_bwd_ratio_vs_softmax']:.2f}x",
                 f"{r['tokens_per_s']:.0f}"]
        if mem:
            m, m0 = r.get("peak_mem_mib"), soft_mem.get(r["length"])
            cells.append("failed" if m is None else f"{m:.0f}")
            cells.append(f"{m / m0:.2f}x" if m is not None and m0 else "-")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
