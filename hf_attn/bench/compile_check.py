"""Does ``torch.compile`` give the eager model's results? Per preset, the eager model against a copy compiled in
place: a training step (loss and every gradient), greedy and beam generation, greedy generation after a weight
update; dynamo's graph breaks, the first-call times, and eager against compiled speed in interleaved rounds."""

from __future__ import annotations

import copy
import os
import statistics
import time
from collections import Counter
from dataclasses import dataclass, field

import torch
import transformers
from torch._dynamo.utils import counters

from .models import alternating_batch, build_hf_attn, config_fields, dropout_off
from .render import COMPILE_CHECKS


@dataclass(frozen=True)
class CompileCheckSettings:
    """What the compile check runs (the script's flags; the defaults are its defaults). ``chunk``: rela_chunk and
    reluformer_query_chunk (small: the ReLU family's block-wise path runs on the short inputs); ``overrides``: config
    fields set for every preset; ``repeats`` 0: no timings."""

    base: str = "marian"
    backend: str = "inductor"
    checks: tuple[str, ...] = COMPILE_CHECKS
    overrides: dict = field(default_factory=dict)
    chunk: int | None = None
    d_model: int = 64
    layers: int = 2
    heads: int = 4
    ffn: int = 128
    vocab: int = 1000
    batch: int = 8
    src_len: int = 16
    tgt_len: int = 14
    decode_len: int = 12
    beams: int = 4
    rtol: float = 1e-4
    repeats: int = 5
    threads: int = 2
    note: str | None = None

    def model_fields(self) -> dict:
        """The config fields of every model checked: sizes, dropout off, the block size if given, the overrides."""
        chunk = {} if self.chunk is None else {"rela_chunk": self.chunk, "reluformer_query_chunk": self.chunk}
        positions = max(64, self.src_len, self.tgt_len + 2, self.decode_len + 2)
        sizes = config_fields(self.base, self.d_model, self.layers, self.heads, self.ffn, self.vocab, positions)
        return {**sizes, **dropout_off(), **chunk, **self.overrides}

    def to_json(self, command: str) -> dict:
        """The ``settings`` of a result file (the load average after the run is added as the run goes)."""
        keep = ("note", "base", "backend", "checks", "overrides", "chunk", "d_model", "layers", "heads", "ffn",
                "vocab", "batch", "src_len", "tgt_len", "decode_len", "beams", "rtol", "repeats", "threads")
        values = {k: getattr(self, k) for k in keep}
        values["checks"] = list(self.checks)
        return {**values, "command": command, "torch": torch.__version__, "transformers": transformers.__version__,
                "cpu_count": os.cpu_count(), "load_average_before": list(os.getloadavg())}


def build_model(s: CompileCheckSettings, preset: str, seed: int = 0):
    """An hf-attn model of ``preset`` with every dropout off, so the eager and the compiled model compute the same
    function; at training step 0 (step-driven schedules such as calibration-anneal need one)."""
    model = build_hf_attn(s.base, preset, s.model_fields(), seed=seed)
    model.set_training_step(0)
    return model


def make_batch(s: CompileCheckSettings) -> dict:
    return alternating_batch(s.vocab, s.batch, s.src_len, s.tgt_len)


def train_step(model, batch) -> tuple[float, dict]:
    """Loss and backward of one training forward; (loss, {parameter name: gradient})."""
    model.train()
    model.zero_grad(set_to_none=True)
    loss = model(**batch).loss
    loss.backward()
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
    return loss.item(), grads


@torch.no_grad()
def perturb(model, seed: int = 3, scale: float = 0.1) -> None:
    """Change every trainable weight in place, as an optimiser step does (the same change for copies of a model)."""
    g = torch.Generator().manual_seed(seed)
    for p in model.parameters():
        if p.requires_grad:
            p.add_(torch.randn(p.shape, generator=g, dtype=p.dtype).to(p.device), alpha=scale)


@torch.no_grad()
def generate(model, batch, beams: int, new_tokens: int) -> torch.Tensor:
    model.eval()
    return model.generate(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], num_beams=beams,
                          do_sample=False, max_new_tokens=new_tokens, min_new_tokens=new_tokens)


def updated_greedy(model, batch, new_tokens: int) -> torch.Tensor:
    """Greedy generation after the weights changed in place: state computed once from the weights (RAN's cached
    matrices in eval mode) must follow them, also in a compiled model."""
    perturb(model)
    return generate(model, batch, 1, new_tokens)


def compare_train(eager: tuple[float, dict], compiled: tuple[float, dict], rtol: float) -> dict:
    """ok when the loss and every gradient agree to ``rtol``: the largest error of a tensor over its largest eager
    entry, or over 1e-4 of the model's largest gradient entry where a gradient is nearly zero throughout (softmax's
    key bias gets none in exact arithmetic: its entries are rounding noise)."""
    loss_e, grads_e = eager
    loss_c, grads_c = compiled
    if set(grads_e) != set(grads_c):
        missing = sorted(set(grads_e) ^ set(grads_c))
        return {"status": "mismatch", "reason": f"gradients present differ: {missing[:3]}"}
    errors = {"loss": abs(loss_c - loss_e) / max(abs(loss_e), 1e-12)}
    floor = 1e-4 * max([g.abs().max().item() for g in grads_e.values()] + [1e-12])
    for name, g in grads_e.items():
        errors[name] = (grads_c[name] - g).abs().max().item() / max(g.abs().max().item(), floor)
    worst = max(errors, key=lambda k: errors[k])
    result = {"max_rel_error": errors[worst], "worst": worst}
    if not all(e <= rtol for e in errors.values()):  # (also catches NaN)
        return {"status": "mismatch", "reason": f"{worst}: relative error {errors[worst]:.2e} > {rtol:g}", **result}
    return {"status": "ok", **result}


def compare_ids(eager: torch.Tensor, compiled: torch.Tensor) -> dict:
    if eager.shape == compiled.shape and torch.equal(eager, compiled):
        return {"status": "ok"}
    if eager.shape != compiled.shape:
        return {"status": "mismatch", "reason": f"shapes {tuple(eager.shape)} vs {tuple(compiled.shape)}"}
    row = int((eager != compiled).any(1).nonzero()[0])
    return {"status": "mismatch", "reason": f"row {row}: {eager[row].tolist()} vs {compiled[row].tolist()}"}


def first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"[:300]


def _seconds(fn, *a) -> float:
    start = time.perf_counter()
    fn(*a)
    return time.perf_counter() - start


def graph_breaks() -> dict:
    """Dynamo's graph-break count since the last reset, and its most frequent reason."""
    reasons = Counter({k: v for k, v in counters["graph_break"].items()})
    top = reasons.most_common(1)
    return {"count": sum(reasons.values()), "top_reason": top[0][0].splitlines()[0][:200] if top else None}


def check_preset(s: CompileCheckSettings, preset: str) -> dict:
    """Eager against compiled for one preset: the checks, graph breaks, compile and step times (a result row)."""
    torch._dynamo.reset()
    counters.clear()
    eager = build_model(s, preset)
    compiled = copy.deepcopy(eager)
    compiled.compile(backend=s.backend)
    batch = make_batch(s)
    row: dict = {"preset": preset, "compile_s": {}}
    fns = {
        "train": lambda m: train_step(m, batch),
        "greedy": lambda m: generate(m, batch, 1, s.decode_len),
        "beam": lambda m: generate(m, batch, s.beams, s.decode_len),
        "updated": lambda m: updated_greedy(m, batch, s.decode_len),
    }
    for check in COMPILE_CHECKS:
        if check not in s.checks:
            row[check] = {"status": "skipped"}
            continue
        try:
            torch.manual_seed(0)
            want = fns[check](eager)
            torch.manual_seed(0)
            start = time.perf_counter()
            got = fns[check](compiled)
            row["compile_s"][check] = time.perf_counter() - start
            row[check] = compare_train(want, got, s.rtol) if check == "train" else compare_ids(want, got)
        except Exception as e:  # a failure is a result: recorded, and the next check runs
            row[check] = {"status": "error", "reason": first_line(e)}
    row["graph_breaks"] = graph_breaks()
    if s.repeats and all(row[c]["status"] == "ok" for c in ("train", "beam")):  # (not timed unless both ran)
        times = {(kind, name): [] for kind in ("train", "beam") for name in ("eager", "compiled")}
        for _ in range(s.repeats):  # interleaved: eager, compiled, eager, ... (shared load cancels in the ratio)
            for name, model in (("eager", eager), ("compiled", compiled)):
                times["train", name].append(_seconds(fns["train"], model))
                times["beam", name].append(_seconds(fns["beam"], model))
        for kind in ("train", "beam"):
            e, c = times[kind, "eager"], times[kind, "compiled"]
            row[f"{kind}_eager_s"], row[f"{kind}_compiled_s"] = statistics.median(e), statistics.median(c)
            row[f"{kind}_speedup"] = statistics.median(a / b for a, b in zip(e, c))
    return row
