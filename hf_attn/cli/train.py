"""``hf-attn train``: train, score and save an hf-attn model (`training.run.train`)."""

from __future__ import annotations

import os
import sys

from .snapshot import unknown_train_flags


def run(argv) -> int:
    unknown_train_flags(argv)  # a flag the command does not have: one line, before torch and transformers load
    from .train_args import parse_train_args

    hargs, targs, overrides, given = parse_train_args(argv)
    from ..training.run import train  # the Trainer, data and metrics stacks: once the flags are parsed

    train(hargs, targs, overrides, given)
    if targs.world_size > 1 and targs.process_index != 0:
        # A worker of an `accelerate launch` / torchrun run has saved its share and left the process group; the
        # main process still scores and writes the run. Leaving through the interpreter's shutdown can destroy a
        # thread that torch.distributed left running ("terminate called without an active exception", exit -6),
        # and the launcher then kills the main process too. Exit at once, with the output flushed.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)
    return 0
