#!/usr/bin/env python
"""On a CUDA GPU with the ``[gpu]`` extra: the sparse baselines (sparsemax, 1.5-entmax) through AdaSplash's Triton
entmax against the `entmax` package's path (``HF_ATTN_KERNELS=eager``), on one model and batch: the same loss and
gradients (checked), and the training-step time of each (forward + backward + AdamW, interleaved rounds, median).

    python scripts/sparse_gpu_check.py                          # base size: d_model 512, 8 heads, 6+6 layers
    python scripts/sparse_gpu_check.py --presets entmax15 --bf16 --batch 64 --src-len 40 --tgt-len 40
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys

import torch

from hf_attn.bench.models import build_hf_attn, config_fields, dropout_off, padded_batch
from hf_attn.bench.timing import timed, train_step
from hf_attn.modeling import attention_softmax
from hf_attn.modeling.fused import KERNELS_ENV

PATHS = {"entmax package": "eager", "adasplash": "auto"}


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--presets", default="sparsemax,entmax15")
    p.add_argument("--d-model", type=int, default=512)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--layers", type=int, default=6)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--src-len", type=int, default=40)
    p.add_argument("--tgt-len", type=int, default=40)
    p.add_argument("--bf16", action="store_true", help="train under bfloat16 autocast")
    p.add_argument("--repeats", type=int, default=20)
    return p.parse_args(argv)


def loss_and_grads(model, batch, bf16: bool):
    model.zero_grad(set_to_none=True)
    with torch.autocast("cuda", dtype=torch.bfloat16, enabled=bf16):
        loss = model(**batch).loss
    loss.backward()
    return loss.detach(), [p.grad.detach().clone() for p in model.parameters() if p.grad is not None]


def check_preset(preset: str, args) -> dict:
    fields = {**config_fields("marian", args.d_model, args.layers, args.heads, 4 * args.d_model, 8000, 512),
              **dropout_off()}
    model = build_hf_attn("marian", preset, fields, device="cuda").train()
    batch = padded_batch(8000, args.batch, args.src_len, args.tgt_len, 0.25, "cuda")
    results = {}
    for name, mode in PATHS.items():
        os.environ[KERNELS_ENV] = mode
        results[name] = loss_and_grads(model, batch, args.bf16)
    (loss_a, grads_a), (loss_b, grads_b) = results.values()
    worst = max(((a - b).abs().max() / b.abs().max().clamp(min=1e-12)).item() for a, b in zip(grads_a, grads_b))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-6)
    times = {name: [] for name in PATHS}

    def step():
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=args.bf16):
            return train_step(model, optimizer, batch)

    for i in range(args.repeats + 2):  # two warm-up rounds (Triton compiles, cuBLAS picks kernels)
        for name, mode in (list(PATHS.items()) if i % 2 == 0 else list(PATHS.items())[::-1]):
            os.environ[KERNELS_ENV] = mode
            seconds = timed("cuda", step)
            if i >= 2:
                times[name].append(seconds)
    os.environ.pop(KERNELS_ENV)
    ms = {name: 1000 * statistics.median(t) for name, t in times.items()}
    return {"loss": (loss_a.item(), loss_b.item()), "worst_relative_grad_difference": worst, "step_ms": ms}


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    if not torch.cuda.is_available() or attention_softmax.adasplash_entmax is None:
        sys.exit("sparse_gpu_check needs a CUDA GPU and the [gpu] extra: pip install 'hf-attn[gpu]'")
    for preset in [p.strip() for p in args.presets.split(",") if p.strip()]:
        r = check_preset(preset, args)
        ms = r["step_ms"]
        print(f"{preset}: loss {r['loss'][0]:.5f} (entmax) vs {r['loss'][1]:.5f} (adasplash), worst relative gradient "
              f"difference {r['worst_relative_grad_difference']:.1e}; train step {ms['entmax package']:.1f} ms "
              f"(entmax) vs {ms['adasplash']:.1f} ms (adasplash): {ms['entmax package'] / ms['adasplash']:.2f}x")


if __name__ == "__main__":
    main()
