#!/usr/bin/env python
"""Aten operators per training step (forward + backward) under bfloat16 autocast, per preset against stock
transformers Marian with SDPA: a timing-free measure of the kernels a model launches (`hf_attn.bench.op_count`).

    python scripts/op_counts.py                      # the main presets, a Markdown table
    python scripts/op_counts.py --presets all --output runs/op_counts.json
    python scripts/op_counts.py --presets rela-g --by-op   # every operator whose count differs from stock
"""

from __future__ import annotations

import argparse
import sys

import torch

import hf_attn
from hf_attn.bench.op_count import op_counts, render_op_counts
from hf_attn.io_utils import write_json

MAIN_PRESETS = ("softmax", "sparsemax", "entmax15", "rela-g", "gmm", "reluformer", "calibration-gate", "ran-d",
                "ran-all", "hard-gaussian", "synthesizer")
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": None}


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--presets", default=",".join(MAIN_PRESETS), help="comma list, or 'all'")
    p.add_argument("--base", choices=["marian", "bart"], default="marian")
    p.add_argument("--layers", type=int, default=2, help="encoder and decoder layers each")
    p.add_argument("--dtype", choices=list(DTYPES), default="bf16", help="autocast dtype (fp32: no autocast)")
    p.add_argument("--by-op", action="store_true", help="also list every operator whose count differs from stock")
    p.add_argument("--output", default=None, help="write {model: {op: count}} as JSON here")
    args = p.parse_args(argv)
    names = sorted(hf_attn.PRESETS) if args.presets == "all" else [x.strip() for x in args.presets.split(",") if x]
    for name in names:
        if name not in hf_attn.PRESETS:
            p.error(f"unknown preset {name!r}; valid presets: {sorted(hf_attn.PRESETS)}")
    args.presets = names
    return args


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    torch.set_num_threads(1)
    counts = op_counts(args.presets, base=args.base, layers=args.layers, dtype=DTYPES[args.dtype])
    print(render_op_counts(counts))
    if args.by_op:
        stock = counts["stock"].by_op
        for name, c in counts.items():
            diff = {op: c.by_op.get(op, 0) - stock.get(op, 0) for op in sorted(set(stock) | set(c.by_op))}
            print(f"{name}: " + ", ".join(f"{op} {d:+d}" for op, d in diff.items() if d))
    if args.output:
        write_json(args.output, {name: c.by_op for name, c in counts.items()})
        print(f"wrote {args.output}")
    return counts


if __name__ == "__main__":
    main()
