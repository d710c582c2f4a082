"""One process of the two-process sampler test (tests/training/test_trainer_faults.py), launched by
`torch.distributed.run` on CPU (gloo).

Iterates hf-attn's length-grouped sampler for three epochs the way accelerate shards it (every process walks the
whole permutation and keeps every n-th batch). Between epochs each process draws a different number of values
from the global RNG, as dropout does on batches of different lengths. Writes every epoch's permutation as JSON."""

from __future__ import annotations

import json
import sys

import torch
import torch.distributed as dist

from hf_attn.training.trainer import ResumableLengthGroupedSampler


def main(out: str) -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(42)  # Trainer seeds every process alike
    sampler = ResumableLengthGroupedSampler(4, lengths=[(7 * i) % 23 + 1 for i in range(40)], shared=True)
    epochs = []
    for epoch in range(3):
        sampler.set_epoch(epoch)
        epochs.append(list(sampler))
        torch.rand(100 + 37 * rank)  # this process's dropout: one draw per activation of its own batches
    with open(f"{out}.{rank}.json", "w") as f:
        json.dump(epochs, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])
