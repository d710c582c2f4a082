"""What a matrix record adds about a run beside its scores: which attention path it ran on (eager torch or
hf-attn's fused kernels, `modeling/fused.py`), the checkpoint-averaging arm (the test split translated again
with the average of the run's last checkpoints, Vaswani et al. 2017 Sec. 6.1: no extra training), and a retrofit
child's step 0 (its parent swapped and scored before any update, `retrofit.py`)."""

from __future__ import annotations

import contextlib
import json
import shutil
import signal
import time
from pathlib import Path

import torch

from ..errors import HfAttnInputError, HfAttnPreempted
from ..generation import translate_texts
from ..modeling import fused
from ..rundir import load_model_dir, run_pairs
from ..training.checkpoints import average_last_checkpoints
from ..training.metrics import score_translations
from ..plans.matrix import RunSpec
from ..plans.retrofit import STEP0_FILE, step_zero_dir

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


@contextlib.contextmanager
def stop_raises(what: str):
    """While inside, a preemption signal (SIGTERM, SIGINT, SIGUSR1) stops ``what`` with `HfAttnPreempted` (exit code
    75, the runner's "stopped, resumes"): nothing of it is kept, and the same command does it again. The handlers
    are `FirstSignal`'s (main thread only, the previous ones put back), acting at once instead of recording."""
    from ..training.trainer import FirstSignal

    class RaiseOnSignal(FirstSignal):
        def _handle(self, signum, frame):
            raise HfAttnPreempted(f"stopped by {signal.Signals(signum).name} during {what}; nothing of it is kept: "
                                  "run the same command again to do it again and resume the matrix")

    handlers = RaiseOnSignal().install()
    try:
        yield
    finally:
        handlers.restore()


def step_zero(spec: RunSpec, runs_dir: Path) -> tuple[dict, list[str]]:
    """(scores, test translations) of a retrofit child at step 0: its parent (``runs_dir/<parent>``, trained)
    swapped to the child's preset with the child's seed, saved to `step_zero_dir` (the child trains from there)
    and translated as the child's final test will be. Done once: a later call reads what the first wrote. A signal
    stops it with `HfAttnPreempted` (`stop_raises`); the next call starts it again."""
    out = step_zero_dir(spec, runs_dir)
    done = out / STEP0_FILE
    if done.is_file():
        saved = json.loads(done.read_text(encoding="utf-8"))
        return saved["scores"], saved["hypotheses"]
    parent = Path(runs_dir) / spec.parent
    if not (parent / "results.json").is_file():
        raise HfAttnInputError(f"{spec.name}: its parent {spec.parent} has no trained model in {parent}; train the "
                               "parent first (`hf-attn reproduce --retrofit` does)")
    if out.exists():  # a sitting stopped while writing it: start it again
        shutil.rmtree(out)
    with stop_raises(f"{spec.name}'s step 0"):
        return _swap_and_score(spec, runs_dir, parent, out, done)


def _swap_and_score(spec: RunSpec, runs_dir: Path, parent: Path, out: Path, done: Path) -> tuple[dict, list[str]]:
    from transformers import set_seed

    from ..cli.train_args import parse_train_args
    from ..data import load_corpus
    from ..training.convert import convert_checkpoint
    from ..report.records import data_arguments

    argv = spec.train_argv(Path(runs_dir) / spec.name, False)
    hargs, targs, _, _ = parse_train_args(argv)
    set_seed(spec.seed)  # the swapped preset's own parameters start as the child's seed draws them
    convert_checkpoint(str(parent), str(out), spec.preset)
    model, tokenizer = load_model_dir(str(out))
    d = data_arguments(argv)
    corpus = load_corpus(d["corpus"], d["source"], d["target"], d["train_file"], d["validation_file"],
                         d["test_file"], d["dataset"], d["dataset_config_name"], {"test": d["max_predict_samples"]})
    sources, references = corpus.pairs("test")
    t0 = time.time()
    with torch.no_grad():
        hyps = translate_texts(model, tokenizer, sources, num_beams=hargs.num_beams,
                               length_penalty=hargs.length_penalty, batch_size=targs.per_device_eval_batch_size,
                               max_source_length=hargs.max_source_length,
                               max_new_tokens=hargs.generation_max_new_tokens, desc="step 0")
    scores = score_translations(hyps, references)
    scores = {**{k: scores[k] for k in SCORE_KEYS}, "decode_seconds": round(time.time() - t0, 1)}
    tmp = done.with_suffix(".tmp")
    tmp.write_text(json.dumps({"scores": scores, "hypotheses": hyps}, indent=1), encoding="utf-8")
    tmp.replace(done)
    return scores, hyps
