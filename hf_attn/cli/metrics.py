"""``hf-attn metrics [DIR]``: the offline sacrebleu/ and chrf/ metric scripts for evaluate.load."""

from __future__ import annotations

from ..metrics import install_metrics
from .flags import OneLineParser

def run(argv) -> int:
    ap = OneLineParser(prog="hf-attn metrics", description="write sacrebleu/sacrebleu.py and chrf/chrf.py "
                       "into DIR: evaluate.load(\"sacrebleu\") run from DIR then loads them, offline")
    ap.add_argument("directory", nargs="?", default=".")
    a = ap.parse_args(argv)
    for path in install_metrics(a.directory):
        print(f"wrote {path}")
    return 0
