"""``hf-attn convert SOURCE OUTPUT_DIR``: a Marian/BART checkpoint with a preset's attention, as a complete model directory."""

from __future__ import annotations

import argparse

from ..training.convert import convert_checkpoint

def run(argv) -> int:
    ap = argparse.ArgumentParser(prog="hf-attn convert", description="swap a preset's attention into a Marian/BART "
                                 "checkpoint and save a complete model directory (model, code, tokenizer, card)")
    ap.add_argument("source", help="a Marian/BART (or hf-attn) model directory or Hub id")
    ap.add_argument("output_dir", help="a new or empty directory")
    ap.add_argument("--preset", default="rela-g", help="the attention preset (`hf-attn presets`; default rela-g)")
    ap.add_argument("--tokenizer", default=None, help="take the tokenizer from here (default: SOURCE)")
    a = ap.parse_args(argv)
    out = convert_checkpoint(a.source, a.output_dir, a.preset, tokenizer=a.tokenizer)
    print(f"converted {a.source} to {a.preset}: {out}")
    return 0
