"""``hf-attn train``: train, score and save an hf-attn model (`training.run.train`)."""

from __future__ import annotations

from ..training.run import train
from .train_args import parse_train_args

def run(argv) -> int:
    hargs, targs, overrides, given = parse_train_args(argv)
    train(hargs, targs, overrides, given)
    return 0
