"""Where the time goes: the matrix-product FLOPs of a call (the FLOP bound), its operators under torch.profiler,
the share stock spends in SDPA, and a preset's extra time against stock."""

from __future__ import annotations

import time

from torch.profiler import ProfilerActivity, profile
from torch.utils.flop_counter import FlopCounterMode

from .results import Profile
from .timing import sync


class _NoModuleTracker:
    """Stands in for FlopCounterMode's module tracker: every FLOP is counted under "Global" only."""

    parents = {"Global"}

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def matmul_flops(fn, *a) -> int:
    """FLOPs of the matrix products (linear, matmul, SDPA) in ``fn(*a)``, counted by torch's FlopCounterMode: the
    ratio stock / preset is the speed a run bound by these products would reach."""
    counter = FlopCounterMode(display=False)
    counter.mod_tracker = _NoModuleTracker()  # totals only: its per-module hooks trip over RAN's cached matrices
    with counter:
        fn(*a)
    return counter.get_total_flops()


def op_profile(device: str, fn, *a, calls: int = 3, cut: float = 1e-3) -> Profile:
    """``calls`` calls of ``fn(*a)`` under torch.profiler, per call: the wall time, the operators' total and their
    self times (CPU, or CUDA on a GPU), largest first; operators under ``cut`` (0.1%) of the total are left out. The
    wall time minus the operators' total is what runs outside them (Python, dispatch, the profiler itself)."""
    cuda = device.startswith("cuda")
    activities = [ProfilerActivity.CUDA] if cuda else [ProfilerActivity.CPU]
    with profile(activities=activities) as prof:
        start = time.perf_counter()
        for _ in range(calls):
            fn(*a)
        sync(device)
        wall = (time.perf_counter() - start) / calls
    time_of = (lambda e: e.self_device_time_total) if cuda else (lambda e: e.self_cpu_time_total)
    events = prof.key_averages()
    ops = {e.key: time_of(e) / 1e6 / calls for e in events}
    total = sum(ops.values())
    kept = sorted(((k, v) for k, v in ops.items() if v >= cut * total and v > 0), key=lambda kv: -kv[1])
    # operator calls (nested ones too, e.g. aten::matmul and the aten::bmm inside it): each pays a dispatch
    op_calls = sum(e.count for e in events) / calls
    # the SDPA ops' time from every event, not the kept ones: on a tiny model one stall elsewhere can push SDPA
    # under the cut (`attention_share`)
    attention = sum(v for k, v in ops.items() if "scaled_dot_product" in k)
    return Profile(wall_s=wall, op_s=total, ops=dict(kept), op_calls=op_calls, attention_s=attention)


def attention_share(prof: Profile) -> float:
    """The share of a profiled call's operator time spent in the SDPA ops (forward and backward). Measured on
    stock, it bounds what any attention variant can gain: one whose attention cost nothing would run at most
    1 / (1 - share) times as fast as stock (Python time outside the ops is left out of the total, so the bound is
    generous)."""
    attention = prof.attention_s  # (profiles written before it was recorded: the kept operators)
    if attention is None:
        attention = sum(t for op, t in prof.ops.items() if "scaled_dot_product" in op)
    return attention / prof.op_s if prof.op_s else 0.0


def extra_time(stock: Profile, prof: Profile, top: int = 4) -> dict:
    """Where a preset's profiled call spends time beyond stock's: the difference in wall time, in operator time
    and outside the operators, and the ``top`` operators with the largest extra self time (seconds)."""
    ops = set(stock.ops) | set(prof.ops)
    delta = {op: prof.ops.get(op, 0.0) - stock.ops.get(op, 0.0) for op in ops}
    return {
        "wall_s": prof.wall_s - stock.wall_s,
        "op_s": prof.op_s - stock.op_s,
        "outside_s": (prof.wall_s - prof.op_s) - (stock.wall_s - stock.op_s),
        "top": sorted(((op, d) for op, d in delta.items() if d > 0), key=lambda kv: -kv[1])[:top],
    }
