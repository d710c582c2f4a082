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
The defaults are docs/speed.md's setting (small Marian, batch 32 x 30 with a quarter padded, beam-4 decoding of
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

The documentation's Speed page (`DOCS_PAGE`) is generated from such JSON files (the block between the benchmark markers):

    python scripts/benchmark.py --docs docs/speed.md --from runs/bench.json runs/bench_long.json

`--gpu-suite` runs the GPU suite instead (one CUDA GPU, at most about 6 minutes: `hf_attn.bench.gpu`): every headline
preset's bf16 training and beam search at base size against stock SDPA, long inputs up to 16k tokens with peak
memory, compiled against compiled stock, and the kernel path each preset took. `--dry-run` runs it at tiny sizes on
the CPU (seconds; not a measurement). With `--docs` it writes the Speed page's "On a GPU" blocks (the kernel table
from the code, and the suite's tables from `--from` JSON files, or a statement that no GPU run exists yet):

    python scripts/benchmark.py --gpu-suite --output runs/gpu.json
    python scripts/benchmark.py --gpu-suite --docs docs/speed.md --from results/benchmark/gpu.json
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

import hf_attn
from hf_attn.modeling.bases import BASES
from hf_attn.bench.render import BENCHMARK_MARKERS, DOCS_PAGE, benchmark_block, render_result, update_block
from hf_attn.bench.gpu import GpuSuiteSettings, dry_run_settings, restricted, run_gpu_suite
from hf_attn.bench.gpu_render import GPU_MARKERS, KERNEL_MARKERS, gpu_block, kernel_table, load_gpu_result, render_gpu_result
from hf_attn.bench.results import DEFAULT_PRESETS, BenchSettings, NotABenchmarkResult
from hf_attn.bench.runner import run, save_result
from hf_attn.io_utils import write_json

DEFAULTS = BenchSettings()
GPU_OUTPUT = "runs/gpu.json"


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--presets", default=None, help="comma list, or 'all' (softmax is always included); default "
                   f"{','.join(DEFAULT_PRESETS)}; with --gpu-suite: limits each of its sections to these")
    p.add_argument("--base", choices=list(BASES), default=DEFAULTS.base)
    p.add_argument("--d-model", type=int, default=DEFAULTS.d_model)
    p.add_argument("--layers", type=int, default=DEFAULTS.layers, help="encoder and decoder layers each")
    p.add_argument("--heads", type=int, default=DEFAULTS.heads)
    p.add_argument("--ffn", type=int, default=DEFAULTS.ffn)
    p.add_argument("--vocab", type=int, default=DEFAULTS.vocab)
    p.add_argument("--batch", type=int, default=DEFAULTS.batch)
    p.add_argument("--src-len", type=int, default=DEFAULTS.src_len)
    p.add_argument("--tgt-len", type=int, default=DEFAULTS.tgt_len)
    p.add_argument("--pad-fraction", type=float, default=DEFAULTS.pad_fraction, help="share of the rows that are "
                   "padded")
    p.add_argument("--decode-batch", type=int, default=DEFAULTS.decode_batch)
    p.add_argument("--decode-src-len", type=int, default=DEFAULTS.decode_src_len)
    p.add_argument("--decode-len", type=int, default=DEFAULTS.decode_len, help="new tokens per decoded sentence")
    p.add_argument("--beams", type=int, default=DEFAULTS.beams)
    p.add_argument("--repeats", type=int, default=DEFAULTS.repeats)
    p.add_argument("--threads", type=int, default=DEFAULTS.threads)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--no-memory", action="store_true", help="skip the per-model memory subprocesses")
    p.add_argument("--no-decode", action="store_true", help="time training steps only")
    p.add_argument("--compile", nargs="?", const="inductor", default=None, metavar="BACKEND",
                   help="compile every model in place, stock included (model.compile(backend=BACKEND), default "
                        "inductor), and time compiled against compiled, one preset beside softmax per run; the calls "
                        "that compile are not timed; no FLOP and memory columns")
    p.add_argument("--profile", action="store_true",
                   help="also profile three calls of every model (torch.profiler) and tabulate where each preset "
                        "spends time beyond stock: the operators with the largest extra self time, and the time "
                        "outside them")
    p.add_argument("--output", default=None, help=f"JSON results (a .md table is written beside); default "
                   f"{DEFAULTS.output}, with --gpu-suite {GPU_OUTPUT}")
    p.add_argument("--long", default=None, help="long-sequence mode: comma list of lengths, e.g. 512,1024,2048,4096")
    p.add_argument("--long-batch", type=int, default=DEFAULTS.long_batch, help="sequences per forward/backward in "
                   "--long mode")
    p.add_argument("--docs", nargs="?", const=DOCS_PAGE, default=None, metavar="PAGE",
                   help=f"rewrite the benchmark block of this page ({DOCS_PAGE} when no PAGE is given) from "
                        "the --from JSON files")
    p.add_argument("--from", dest="sources", nargs="+", default=None, help="benchmark JSON files for --docs")
    p.add_argument("--gpu-suite", action="store_true", help="the GPU suite (hf_attn.bench.gpu): one CUDA GPU, about "
                   "6 minutes; with --docs: the page's 'On a GPU' blocks (--from optional)")
    p.add_argument("--dry-run", action="store_true", help="with --gpu-suite: tiny sizes on the CPU, seconds (checks "
                   "the suite; not a measurement)")
    p.add_argument("--allow-dry-run", action="store_true", help="with --gpu-suite --docs: accept dry-run JSON files")
    args = p.parse_args(argv)
    check_modes(p, args)
    args.presets_given = args.presets is not None
    args.presets = ",".join(DEFAULT_PRESETS) if args.presets is None else args.presets
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


def check_modes(p: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """--docs / --from, --gpu-suite / --dry-run: the combinations that go together; the output's default."""
    if args.dry_run and not args.gpu_suite:
        p.error("--dry-run goes with --gpu-suite")
    if args.sources is not None and args.docs is None or (args.docs is not None and args.sources is None
                                                          and not args.gpu_suite):
        p.error(f"--docs {DOCS_PAGE} and --from RESULT.json ... go together")
    if args.gpu_suite and args.docs is None and not args.dry_run and not torch.cuda.is_available():
        p.error("--gpu-suite needs a CUDA GPU and torch sees none; --gpu-suite --dry-run runs it at tiny sizes on "
                "the CPU")
    args.output = args.output or (GPU_OUTPUT if args.gpu_suite else DEFAULTS.output)


def bench_settings(args: argparse.Namespace) -> BenchSettings:
    """The run the parsed flags ask for."""
    return BenchSettings(
        presets=tuple(args.presets), base=args.base, d_model=args.d_model, layers=args.layers, heads=args.heads,
        ffn=args.ffn, vocab=args.vocab, batch=args.batch, src_len=args.src_len, tgt_len=args.tgt_len,
        pad_fraction=args.pad_fraction, decode_batch=args.decode_batch, decode_src_len=args.decode_src_len,
        decode_len=args.decode_len, beams=args.beams, repeats=args.repeats, threads=args.threads, device=args.device,
        no_memory=args.no_memory, no_decode=args.no_decode, compile=args.compile, profile=args.profile,
        output=args.output, long=None if args.long is None else tuple(args.long), long_batch=args.long_batch)


def gpu_suite(args: argparse.Namespace, argv: list[str]):
    """--gpu-suite: run it and write the JSON (and its tables beside), or (--docs) rewrite the page's GPU blocks."""
    if args.docs:
        sources = [Path(s) for s in args.sources or []]
        for path in sources:
            try:
                dry = load_gpu_result(path)["settings"]["dry_run"]
            except NotABenchmarkResult as e:
                raise SystemExit(f"benchmark: {path} is not a GPU suite result ({e}); pass the JSON that "
                                 "scripts/benchmark.py --gpu-suite --output wrote")
            if dry and not args.allow_dry_run:
                raise SystemExit(f"benchmark: {path} is a dry run (tiny model on the CPU), not a GPU measurement; "
                                 "pass the JSON of a run on a GPU")
        body = gpu_block(sources)
        update_block(Path(args.docs), GPU_MARKERS, body, "benchmark")
        update_block(Path(args.docs), KERNEL_MARKERS, kernel_table(), "benchmark")
        return body
    settings = dry_run_settings() if args.dry_run else GpuSuiteSettings(device=args.device)
    if args.presets_given:
        settings = restricted(settings, args.presets)
    result = run_gpu_suite(settings, "python scripts/benchmark.py " + " ".join(argv))
    output = Path(args.output)
    output.parent.mkdir(parents=True, exist_ok=True)
    write_json(output, result)
    output.with_suffix(".md").write_text(render_gpu_result(result) + "\n", encoding="utf-8")
    print(render_gpu_result(result))
    print(f"wrote {output} and {output.with_suffix('.md')}")
    return result


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    if args.gpu_suite:
        torch.set_num_threads(args.threads)
        return gpu_suite(args, argv)
    if args.docs:
        body = benchmark_block([Path(s) for s in args.sources])
        update_block(Path(args.docs), BENCHMARK_MARKERS, body, "benchmark")
        return body
    torch.set_num_threads(args.threads)
    result = run(bench_settings(args), "python scripts/benchmark.py " + " ".join(argv))
    print(render_result(result))
    for path in save_result(result, Path(args.output)):
        print(f"wrote {path}")
    return result


if __name__ == "__main__":
    main()
