"""What a matrix record adds about a finished run beside its scores: which attention path it ran on (eager torch or
hf-attn's fused kernels, `modeling/fused.py`), and the checkpoint-averaging arm (the test split translated again
with the average of the run's last checkpoints, Vaswani et al. 2017 Sec. 6.1: no extra training)."""

from __future__ import annotations

import time
from pathlib import Path

import torch

from ..generation import translate_texts
from ..modeling import fused
from ..rundir import load_model_dir, run_pairs
from ..training.checkpoints import average_last_checkpoints
from ..training.metrics import score_translations

SCORE_KEYS = ("bleu", "chrf", "bleu_signature", "chrf_signature", "bleu_details")


def run_device() -> torch.device:
    """Where a run of this process trained: the GPU when there is one (Trainer's choice), else the CPU."""
    return torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")


def device_kind() -> str:
    """The device kind records compare on: the GPU's name, or the CPU's architecture."""
    import platform

    return torch.cuda.get_device_name() if torch.cuda.is_available() else f"{platform.machine()} CPU"


def _site(name: str) -> str | None:
    if name.endswith("encoder_attn"):
        return "cross"
    if name.endswith("self_attn"):
        return "decoder" if ".decoder." in f".{name}" else "encoder"
    return None


def attention_path(model, tokenizer, device: torch.device | None = None) -> dict:
    """Which path each attention site of ``model`` takes on ``device`` in training mode: one forward pass of a short
    pair, with every `fused.dispatch` decision recorded per module (`fused.record_paths`). A site is "fused" when
    all its layers ran a fused Triton kernel, "sdpa" when all ran torch's SDPA (softmax; GMM's distributed product),
    "eager" when all ran the eager path (a module that made no decision: no fused path), else "mixed"."""
    device = device or run_device()
    model = model.to(device).train()
    enc = tokenizer(["Im Anfang war das Wort."], text_target=["In the beginning was the Word."], return_tensors="pt")
    with fused.record_paths() as trace, torch.no_grad():
        model(**{k: v.to(device) for k, v in enc.items()})
    names = {fused.TRITON: "fused", fused.SDPA: "sdpa", fused.EAGER: "eager"}
    sites: dict[str, set[str]] = {}
    for name, module in model.named_modules():
        site = _site(name)
        if site:
            taken = set().union(*(trace.by_module.get(id(sub), set()) for sub in module.modules()))
            sites.setdefault(site, set()).add(names[taken.pop()] if len(taken) == 1 else "mixed" if taken else "eager")
    path = {s: paths.pop() if len(paths) == 1 else "mixed" for s, paths in sites.items()}
    return {"device": device_kind(), "kernels": fused.kernel_mode(model.config),
            "triton": getattr(fused.triton, "__version__", None), "sites": path}


def run_attention_path(run_dir: Path) -> dict:
    model, tokenizer = load_model_dir(str(run_dir))
    return attention_path(model, tokenizer)


def averaged_arm(run_dir: Path, n: int) -> tuple[dict, list[str]]:
    """(scores, translations) of the test split with the average of the run's last ``n`` checkpoints (the final
    weights among them), decoded as the run decoded it (beam, length penalty, source length)."""
    import json

    run = json.loads((Path(run_dir) / "results.json").read_text(encoding="utf-8"))
    model, tokenizer = load_model_dir(str(run_dir))
    names = average_last_checkpoints(model, run_dir, n, int(run["train_steps"]))
    model.to(run_device()).eval()
    n = int(run["test_sentences"])  # the run's test split (its --max_predict_samples, if any)
    sources, references, _, _ = run_pairs(str(run_dir), "test", max_samples=n)
    sources, references = sources[:n], references[:n]
    t0 = time.time()
    hyps = translate_texts(model, tokenizer, sources, num_beams=run["num_beams"], length_penalty=run["length_penalty"],
                           max_source_length=run["max_source_length"], progress=False)
    scores = score_translations(hyps, references)
    arm = {"checkpoints": names, **{k: scores[k] for k in SCORE_KEYS}, "decode_seconds": round(time.time() - t0, 1)}
    return arm, hyps
