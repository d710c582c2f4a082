#!/usr/bin/env python
"""Does `torch.compile` give the eager model's results, for every preset? And what does it gain or cost?

For each preset (on a small model, dropout off) the eager model and a copy compiled in place with
``model.compile()`` (the same compiled forward as ``torch.compile(model)``, but ``model.generate`` then runs it too)
are compared on
  * a training step: loss and backward; the loss and every parameter's gradient must match the eager ones to
    `--rtol` (relative to the largest entry of that gradient), and
  * ``generate``: greedy and beam-`--beams` search of `--decode-len` new tokens; the ids must be identical, and
  * greedy ``generate`` again after every weight changed in place (``updated``; as after an optimiser step).
Each check is ok, mismatch (the largest error, or the first differing row) or error (the exception's first line).
Also recorded: the graph breaks dynamo reports (count and the most frequent reason), the first-call time of each
compiled path (compilation included), and the speed of a training step (forward + backward) and of beam search,
eager against compiled, in `--repeats` interleaved rounds (median of the per-round ratios t_eager / t_compiled,
> 1 = compiled faster). The JSON is rewritten after every preset; ``--docs`` regenerates the block of the
documentation's Speed page (`DOCS_PAGE`):

    python scripts/check_compile.py --output results/compile/compile.json                    # every Marian preset
    python scripts/check_compile.py --base bart --presets softmax,rela-g,gmm --output runs/compile_bart.json
    python scripts/check_compile.py --docs docs/speed.md --from results/compile/compile.json [--no-timings]

Timings taken on a busy machine are noise: the JSON records the load average before and after the run.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
from pathlib import Path

import torch
from tqdm.auto import tqdm

import hf_attn
from hf_attn.modeling.bases import BASES
from hf_attn.bench.compile_check import CompileCheckSettings, check_preset
from hf_attn.bench.render import (COMPILE_CHECKS, COMPILE_MARKERS, DOCS_PAGE, compile_block, compile_status,
                                  render_compile_table, update_block)
from hf_attn.io_utils import write_json

DEFAULTS = CompileCheckSettings()


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--presets", default="all", help="comma list, or 'all'")
    p.add_argument("--base", choices=list(BASES), default=DEFAULTS.base)
    p.add_argument("--backend", default=DEFAULTS.backend, help="torch.compile backend (inductor, aot_eager, eager)")
    p.add_argument("--d-model", type=int, default=DEFAULTS.d_model)
    p.add_argument("--layers", type=int, default=DEFAULTS.layers, help="encoder and decoder layers each")
    p.add_argument("--heads", type=int, default=DEFAULTS.heads)
    p.add_argument("--ffn", type=int, default=DEFAULTS.ffn)
    p.add_argument("--vocab", type=int, default=DEFAULTS.vocab)
    p.add_argument("--batch", type=int, default=DEFAULTS.batch)
    p.add_argument("--src-len", type=int, default=DEFAULTS.src_len)
    p.add_argument("--tgt-len", type=int, default=DEFAULTS.tgt_len)
    p.add_argument("--decode-len", type=int, default=DEFAULTS.decode_len, help="new tokens per generated sentence")
    p.add_argument("--beams", type=int, default=DEFAULTS.beams)
    p.add_argument("--chunk", type=int, default=None, help="rela_chunk and reluformer_query_chunk (e.g. 4: the "
                   "ReLU family's block-wise path runs on the short test inputs)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="FIELD=VALUE",
                   help="config override for every preset checked, e.g. --set encoder_attention=rela (repeatable; "
                   "the value is read as JSON where it parses, else as a string)")
    p.add_argument("--checks", default=",".join(COMPILE_CHECKS), help="comma list of checks to run (of "
                   f"{','.join(COMPILE_CHECKS)})")
    p.add_argument("--rtol", type=float, default=DEFAULTS.rtol, help="loss and gradients: error / largest eager entry")
    p.add_argument("--repeats", type=int, default=DEFAULTS.repeats, help="interleaved timing rounds (0: no timings)")
    p.add_argument("--threads", type=int, default=DEFAULTS.threads)
    p.add_argument("--output", default="runs/compile.json")
    p.add_argument("--note", default=None, help="a remark kept in the JSON and shown with the table (e.g. the "
                   "machine was busy)")
    p.add_argument("--docs", nargs="?", const=DOCS_PAGE, default=None, metavar="PAGE",
                   help=f"rewrite the compile block of this page ({DOCS_PAGE} when no PAGE is given) from "
                        "the --from JSON files")
    p.add_argument("--from", dest="sources", nargs="+", default=None, help="check_compile JSON files for --docs")
    p.add_argument("--no-timings", action="store_true", help="--docs: correctness columns only")
    args = p.parse_args(argv)
    if (args.docs is None) != (args.sources is None):
        p.error(f"--docs {DOCS_PAGE} and --from RESULT.json ... go together")
    args.checks = [c.strip() for c in args.checks.split(",") if c.strip()]
    if not args.checks or set(args.checks) - set(COMPILE_CHECKS):
        p.error(f"--checks {','.join(args.checks)!r}: choose among {','.join(COMPILE_CHECKS)}")
    args.overrides = dict(parse_override(p, x) for x in args.overrides)
    names = args.presets.split(",")
    args.presets = sorted(hf_attn.PRESETS) if args.presets == "all" else [x.strip() for x in names if x.strip()]
    for name in args.presets:
        if name not in hf_attn.PRESETS:
            p.error(f"unknown preset {name!r}; valid presets: {sorted(hf_attn.PRESETS)}")
    return args


def parse_override(p: argparse.ArgumentParser, text: str) -> tuple[str, object]:
    field, sep, value = text.partition("=")
    if not sep or not field:
        p.error(f"--set {text!r}: need FIELD=VALUE, e.g. --set encoder_attention=rela")
    try:
        return field, json.loads(value)
    except ValueError:
        return field, value


def check_settings(args: argparse.Namespace) -> CompileCheckSettings:
    """The checks the parsed flags ask for."""
    return CompileCheckSettings(
        base=args.base, backend=args.backend, checks=tuple(args.checks), overrides=args.overrides, chunk=args.chunk,
        d_model=args.d_model, layers=args.layers, heads=args.heads, ffn=args.ffn, vocab=args.vocab, batch=args.batch,
        src_len=args.src_len, tgt_len=args.tgt_len, decode_len=args.decode_len, beams=args.beams, rtol=args.rtol,
        repeats=args.repeats, threads=args.threads, note=args.note)


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    if args.docs:
        body = compile_block([Path(s) for s in args.sources], timings=not args.no_timings)
        update_block(Path(args.docs), COMPILE_MARKERS, body, "check_compile")
        return body
    torch.set_num_threads(args.threads)
    settings = check_settings(args)
    result = {"settings": settings.to_json(shlex.join(["python", "scripts/check_compile.py", *argv])), "rows": []}
    out = Path(args.output)
    out.parent.mkdir(parents=True, exist_ok=True)
    bar = tqdm(args.presets, desc=f"compile checks ({args.base}, {args.backend})")
    for preset in bar:
        bar.set_postfix_str(preset)
        row = check_preset(settings, preset)
        result["rows"].append(row)
        result["settings"]["load_average_after"] = list(os.getloadavg())
        write_json(out, result)  # after every preset: a long run keeps what it has done
        tqdm.write(f"{preset}: {compile_status(row)} " + "; ".join(
            f"{c} {row[c]['status']}" + (f" ({row[c]['reason']})" if "reason" in row[c] else "")
            for c in COMPILE_CHECKS))
    print(render_compile_table(result, timings=True))
    print(f"wrote {out}")
    return result


if __name__ == "__main__":
    main()
