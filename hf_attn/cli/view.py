"""``hf-attn view DIR [DIR2 ...] --output attention.html``: one self-contained HTML attention viewer."""

from __future__ import annotations

import argparse
from pathlib import Path

from ..analysis import viewer
from ..rundir import SPLITS
from .flags import OneLineParser


def view_parser() -> argparse.ArgumentParser:
    ap = OneLineParser(prog="hf-attn view", description=viewer.__doc__,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model_dirs", nargs="+", help="model directories (`hf-attn train` or save_pretrained); two or more "
                    "are shown side by side and must share one tokenizer")
    ap.add_argument("--output", "-o", required=True, help="the HTML file to write, e.g. attention.html")
    what = ap.add_mutually_exclusive_group()
    what.add_argument("--sentences", type=int, default=None, help="the first N pairs of the first run's test split "
                      "(default 20)")
    what.add_argument("--text", default=None, help="one source sentence instead (attention over each model's own "
                      "translation)")
    ap.add_argument("--split", default="test", choices=SPLITS)
    ap.add_argument("--test_file", "--test-file", default=None, help="pairs from this file instead of the run's data")
    ap.add_argument("--max_tokens", "--max-tokens", type=int, default=64, help="truncate sources and targets to this "
                    "many tokens (default 64)")
    ap.add_argument("--num_beams", "--num-beams", "--beam", type=int, default=None, help="beam for the translations "
                    "(default: the model's)")
    ap.add_argument("--preview", default=None, help="also write a PNG of the first sentence's cross-attention here")
    return ap


def run(argv) -> int:
    a = view_parser().parse_args(argv)
    out = viewer.write_viewer([Path(d) for d in a.model_dirs], Path(a.output), a.sentences, a.text, a.test_file,
                              a.split, a.max_tokens, a.num_beams, Path(a.preview) if a.preview else None)
    print(f"wrote {out} ({out.stat().st_size / 1e6:.2f} MB)")
    return 0
