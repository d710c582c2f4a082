"""Timing: the calls that are timed (a training step, a beam search, a forward + backward), interleaved rounds whose
order rotates, per-round speed ratios and their quartiles, and the untimed warm-up (with dynamo's recompile limit
watched when the models run compiled)."""

from __future__ import annotations

import contextlib
import logging
import statistics
import time

import torch
from tqdm.auto import tqdm

from .results import STOCK


def sync(device: str) -> None:
    """Wait for the queued GPU work (a no-op on the CPU), so a clock read after it covers it."""
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def timed(device: str, fn, *a) -> float:
    """Seconds of ``fn(*a)`` on ``device``, its queued GPU work included."""
    sync(device)
    start = time.perf_counter()
    fn(*a)
    sync(device)
    return time.perf_counter() - start


def autocast(batch, amp: torch.dtype | None):
    """Autocast to ``amp`` on the device of ``batch``'s input ids (no context without ``amp``)."""
    if amp is None:
        return contextlib.nullcontext()
    return torch.autocast(device_type=batch["input_ids"].device.type, dtype=amp)


def train_step(model, optimizer, batch, amp: torch.dtype | None = None) -> float:
    """Forward (under ``amp`` autocast, e.g. bf16 mixed precision), backward and an optimiser step; the loss."""
    loss = forward_backward(model, batch, amp, zero_grad=False)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return loss


def forward_backward(model, batch, amp: torch.dtype | None = None, zero_grad: bool = True) -> float:
    """Forward (under ``amp`` autocast) and backward, no optimiser step; the loss."""
    model.train()
    with autocast(batch, amp):
        loss = model(**batch).loss
    loss.backward()
    if zero_grad:
        model.zero_grad(set_to_none=True)
    return loss.item()


@torch.no_grad()
def decode(model, batch, beams: int, new_tokens: int) -> torch.Tensor:
    """Beam search of exactly ``new_tokens`` new tokens (every model does the same work, also with random weights)."""
    model.eval()
    return model.generate(
        **batch,
        num_beams=beams,
        max_new_tokens=new_tokens,
        min_new_tokens=new_tokens,
        do_sample=False,
        early_stopping=False,
    )


def rounds(items, repeats: int, desc: str):
    """The (name, model) pairs of each of ``repeats`` rounds, the order rotated by one per round (no model always
    runs first)."""
    items = list(items)
    for r in tqdm(range(repeats), desc=desc):
        k = r % len(items)
        yield items[k:] + items[:k]


def interleaved(device: str, step, models: dict, repeats: int, desc: str, stop=None) -> dict:
    """{name: [seconds per round]} of ``step(model, optimizer)`` for every model of ``models`` ({name: (model,
    optimizer)}), in interleaved `rounds`, each call timed with its queued GPU work (`timed`: a CUDA synchronise
    before and after). ``stop(rounds_done, seconds_of_last_round)``: True ends the loop early (a time budget)."""
    times = {name: [] for name in models}
    for r, order in enumerate(rounds(models.items(), repeats, desc)):
        start = time.monotonic()
        for name, (model, opt) in order:
            times[name].append(timed(device, step, model, opt))
        if stop is not None and r + 1 < repeats and stop(r + 1, time.monotonic() - start):
            break
    return times


def per_round(times: dict, name: str, reference: str = STOCK) -> list[float]:
    """The per-round speed ratios t_reference / t_name (> 1 = faster), one per interleaved round."""
    return [r / t for r, t in zip(times[reference], times[name])]


def ratios(times: dict, name: str) -> dict:
    """Median per-round speed ratios of ``name`` against the stock model and hf-attn softmax (> 1 = faster)."""
    return {ref: statistics.median(per_round(times, name, key))
            for ref, key in (("stock", STOCK), ("softmax", "softmax"))}


def ratio_quartiles(times: dict, name: str) -> tuple[float, float] | None:
    """The first and third quartiles of the per-round ratios t_stock / t_name (None under 2 rounds): how far the
    rounds scatter around the median on this machine."""
    per = per_round(times, name)
    if len(per) < 2:
        return None
    q1, _, q3 = statistics.quantiles(per, n=4, method="inclusive")
    return q1, q3


def warm_up(device: str, step, models: dict, compiled: bool, max_passes: int = 5) -> dict:
    """Untimed calls of ``step(model, optimizer)`` on every model of ``models`` ({name: (model, optimizer)}): one
    each, or, ``compiled``, passes over all models until a whole pass compiles no new graph (at most
    ``max_passes``): compiling one model can make dynamo recompile code the models share (shapes it marks dynamic),
    so one call per model is not enough. Returns {name: seconds}."""
    seconds = dict.fromkeys(models, 0.0)
    graphs = torch._dynamo.utils.counters["stats"]
    for _ in range(max_passes if compiled else 1):
        before = graphs["unique_graphs"]
        for name, (model, opt) in models.items():
            seconds[name] += timed(device, step, model, opt)
        if graphs["unique_graphs"] == before:
            break
    return seconds


def raise_recompile_limits(n_models: int) -> None:
    """hf-attn models of every preset are one class, so their forward functions share dynamo's per-function cache:
    at its default limit (8 graphs) the later models would silently fall back to eager."""
    config = torch._dynamo.config
    config.recompile_limit = max(config.recompile_limit, 16 * n_models)
    config.accumulated_recompile_limit = max(config.accumulated_recompile_limit, 64 * n_models)


class RecompileLimitHits(logging.Handler):
    """Collects dynamo's "hit config.recompile_limit" warnings: each names a function that runs eagerly from then
    on, so the compiled timings would be partly eager. `detach()` stops collecting and returns their first lines."""

    def __init__(self):
        super().__init__(logging.WARNING)
        self.hits: list[str] = []
        self.logger = logging.getLogger("torch._dynamo.convert_frame")
        self.logger.addHandler(self)

    def emit(self, record):
        message = record.getMessage()
        if "recompile_limit" in message:
            self.hits.append(" ".join(message.split("\n")[:2]))

    def detach(self) -> list[str]:
        self.logger.removeHandler(self)
        super().close()
        return self.hits
