"""Where GMM's time goes, as shares of stock transformers' own time, measured in the same run.

`scripts/benchmark.py` times whole training steps and beam searches; this script times GMM's own work at the same
shapes (the benchmark's defaults, or the same size flags) and divides it by the time of the stock model with SDPA,
timed in the same round: per training step (forward + backward, every decoder layer) and per beam-search decode
(every decoder layer at every step). Parts:

  * ffn: the four FFNs of Eq. 7-9 and 14 (`GmmAttention.ffn_joint`, with the backward in training);
  * mixture: Eq. 6 and 10-12 from the FFNs' output (`mixture_attention`);
  * attend - sdpa: GMM's whole cross-attention (`attend`: alpha, mixture, gate, values) minus SDPA's on the same
    q, k, v: the extra of a GMM layer over a stock one;
  * adamw: one AdamW step over GMM's extra parameter tensors (training only).

A target of r x stock leaves 1/r - 1 of stock's time (5.3% at 0.95x) for everything a preset adds, so a part's share
says whether that is within reach. The inputs of one layer are captured from a real forward pass (training) or
decoding step (step 6) of the benchmark's model and replayed; rounds interleave stock and the parts, and each share
is the median over rounds:

    python scripts/gmm_budget.py --rounds 21 --output runs/gmm_budget.json
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import torch
from tqdm.auto import tqdm

sys.path.insert(0, str(Path(__file__).resolve().parent))
import benchmark  # the benchmark's size and batch flags

import hf_attn
from hf_attn.bench.results import BenchSettings
from hf_attn.bench.runner import build_preset, build_reference, decode_batch, train_batch
from hf_attn.bench.timing import decode, timed, train_step
from hf_attn.io_utils import write_json


def capture(model, layer, run, call: int = 1):
    """(q, k, v, keep, ctx) of the ``call``-th `attend` call of one decoder layer's cross-attention during ``run()``."""
    module = model.model.decoder.layers[layer].encoder_attn
    cls, seen, found = type(module), [0], {}
    original, own = cls.attend, "attend" in vars(cls)  # own: defined on the layer's class, not inherited

    def spy(self, q, k, v, keep, ctx):
        if self is module:
            seen[0] += 1
            if seen[0] == call:
                found["inputs"] = (q.detach(), k.detach(), v.detach(), keep, ctx)
        return original(self, q, k, v, keep, ctx)

    cls.attend = spy
    try:
        run()
    finally:  # as it was: an inherited attend stays inherited, or patching the variant's class misses this layer
        if own:
            cls.attend = original
        else:
            del cls.attend
    return module, found["inputs"]


def training_parts(s: BenchSettings, model, batch):
    """{part: (fn, calls per training step)} on one layer's inputs captured from a training pass over ``batch``."""
    model.train()
    module, (q, k, v, keep, ctx) = capture(model, 0, lambda: model(**batch))
    geometry = module.source_geometry(keep, None)
    with torch.no_grad():
        ffn_out = module.ffn_joint(q)
    grad_out = torch.randn(q.shape, device=q.device)
    grad_beta = torch.randn(*q.shape[:-1], k.shape[-2], device=q.device)
    mask = keep.dense()

    def ffn():
        leaf = q.clone().requires_grad_()
        out = module.ffn_joint(leaf)
        out.backward(torch.ones_like(out))

    def mixture():
        leaf = ffn_out.clone().requires_grad_()
        beta, gate, _ = module.mixture_attention(leaf, geometry, ctx, details=False)
        loss = (beta * grad_beta).sum()
        (loss if gate is None else loss + gate.sum()).backward()

    def attend():
        leaves = [x.clone().requires_grad_() for x in (q, k, v)]
        module.attend(*leaves, keep, ctx)[0].backward(grad_out)

    def sdpa():
        leaves = [x.clone().requires_grad_() for x in (q, k, v)]
        torch.nn.functional.scaled_dot_product_attention(*leaves, attn_mask=mask).backward(grad_out)

    params = [p for name, p in model.named_parameters() if ".gmm_" in name]
    optimizer = torch.optim.AdamW(params, lr=1e-4)

    def adamw():
        for p in params:
            p.grad = torch.zeros_like(p)
        optimizer.step()

    layers = s.layers
    return {"ffn": (ffn, layers), "mixture": (mixture, layers), "attend": (attend, layers), "sdpa": (sdpa, layers),
            f"adamw ({len(params)} tensors)": (adamw, 1)}


def decoding_parts(s: BenchSettings, model, batch):
    """{part: (fn, calls per decode)} on one layer's inputs captured at decoding step 6 (or the last, if fewer) of
    ``batch``."""
    step = min(6, s.decode_len)
    module, (q, k, v, keep, ctx) = capture(model, min(1, s.layers - 1),
                                           lambda: decode(model, batch, s.beams, s.decode_len), step)
    geometry = module.source_geometry(keep, ctx)
    mask = keep.dense()
    with torch.no_grad():
        ffn_out = module.ffn_joint(q)
    calls = s.layers * s.decode_len
    return {"ffn": (lambda: module.ffn_joint(q), calls),
            "mixture": (lambda: module.mixture_attention(ffn_out, geometry, ctx, details=False), calls),
            "attend": (lambda: module.attend(q, k, v, keep, ctx), calls),
            "sdpa": (lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask), calls)}


def shares(s: BenchSettings, reference, parts: dict, rounds: int, desc: str) -> dict:
    """Median over interleaved rounds of (time of a part's calls) / (time of ``reference()``) in the same round."""
    for fn in [reference] + [fn for fn, _ in parts.values()]:
        fn()  # warm-up

    def repeated(fn, calls):
        for _ in range(calls):
            fn()

    times = {"reference": []} | {name: [] for name in parts}
    for _ in tqdm(range(rounds), desc=desc):
        times["reference"].append(timed(s.device, reference))  # (synchronises the device, as the benchmark does)
        for name, (fn, calls) in parts.items():
            times[name].append(timed(s.device, repeated, fn, calls))
    ratio = {name: [t / r for t, r in zip(times[name], times["reference"])] for name in parts}
    ratio["attend - sdpa"] = [a - s for a, s in zip(ratio["attend"], ratio["sdpa"])]
    return {"reference_median_s": statistics.median(times["reference"]),
            "shares": {name: statistics.median(values) for name, values in ratio.items()},
            "calls": {name: calls for name, (_, calls) in parts.items()}}


def render(result: dict) -> str:
    s = result["settings"]
    header = (f"{s['base']} d_model={s['d_model']} layers={s['layers']}+{s['layers']} heads={s['heads']}; {s['rounds']} "
              f"interleaved rounds; share = median of (part's time) / (stock {s['base']} with SDPA's time) per round")
    lines = [header, "", "| part | share of a stock training step | share of a stock beam-search decode |", "|---|---|---|"]
    train, decode = result["train"]["shares"], result["decode"]["shares"]
    for name in list(train):
        lines.append(f"| {name} | {100 * train[name]:.1f}% | {f'{100 * decode[name]:.1f}%' if name in decode else ''} |")
    lines.append(f"| (stock time, median) | {result['train']['reference_median_s']:.3f} s | "
                 f"{result['decode']['reference_median_s']:.3f} s |")
    return "\n".join(lines)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=15)
    p.add_argument("--preset", default="gmm", help="a GMM preset (gmm, gmm-strict, gmm-synthesis, ...)")
    p.add_argument("--output", default=None, help="JSON results")
    ours, rest = p.parse_known_args(argv)
    if ours.rounds < 1:
        p.error(f"--rounds {ours.rounds}: need at least 1 round, e.g. 15")
    # the benchmark's sizes and batches (--base, --d-model, ...)
    s = benchmark.bench_settings(benchmark.parse_args(["--presets", ours.preset, *rest]))
    if hf_attn.PRESETS[ours.preset].overrides.get("cross_attention") != "gmm":
        p.error(f"--preset {ours.preset!r} does not use GMM cross-attention; pick one of "
                f"{sorted(n for n in hf_attn.PRESETS if n.startswith('gmm'))}")
    torch.set_num_threads(s.threads)
    stock, stock_opt = build_reference(s, build_preset(s, "softmax")[0])
    model, _ = build_preset(s, ours.preset)
    train_inputs, decode_inputs = train_batch(s), decode_batch(s)
    train = shares(s, lambda: train_step(stock, stock_opt, train_inputs), training_parts(s, model, train_inputs),
                   ours.rounds, "training parts")
    with torch.no_grad():
        decoding = shares(s, lambda: decode(stock, decode_inputs, s.beams, s.decode_len),
                          decoding_parts(s, model, decode_inputs), ours.rounds, "decoding parts")
    settings = {"command": "python scripts/gmm_budget.py " + " ".join(sys.argv[1:] if argv is None else argv),
                "preset": ours.preset, "rounds": ours.rounds, "base": s.base, "d_model": s.d_model,
                "layers": s.layers, "heads": s.heads, "threads": s.threads, "torch": torch.__version__}
    result = {"settings": settings, "train": train, "decode": decoding}
    print(render(result))
    if ours.output:
        write_json(Path(ours.output), result)
        print(f"wrote {ours.output}")
    return result


if __name__ == "__main__":
    main()
