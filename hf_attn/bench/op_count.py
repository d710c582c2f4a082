"""Dispatched aten operators per training step: a timing-free measure of how many kernels a model launches.

On a GPU a small model's training step is bound by the host issuing kernels (one per dispatched operator, roughly),
so each extra elementwise op, dtype cast or custom autograd node costs wall time. `count_ops` counts the aten
operators a callable dispatches (forward and backward alike) with a `TorchDispatchMode`, which sees every operator
below autograd and autocast: autocast's casts (``_to_copy``) are counted, views and metadata-only operators are not
launches and are left out. `training_step_ops` counts one forward + backward under mixed-precision autocast, and
`op_counts` compares presets with stock transformers (SDPA) of the same sizes, holding the same weights.

The counts are exact and repeatable (no timing), so a test can bound them; they are counted on the CPU, whose
autocast casts the same operators to bfloat16 as CUDA's does for the matmuls (CUDA's also runs a few reductions and
pointwise functions in float32, which the CPU's does not: the CUDA counts differ by those casts).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from .models import build_hf_attn, build_stock, config_fields, dropout_off, padded_batch

# Operators that launch no kernel: views, aliasing, metadata (shape, stride queries) and allocations.
_NO_KERNEL = {
    "view", "_unsafe_view", "reshape", "expand", "permute", "transpose", "t", "unsqueeze", "squeeze", "select",
    "slice", "as_strided", "alias", "detach", "unbind", "split", "split_with_sizes", "chunk", "narrow", "diagonal",
    "unflatten", "flatten", "numpy_T", "expand_as", "view_as", "_reshape_alias", "lift_fresh", "sym_size",
    "sym_stride", "sym_numel", "sym_storage_offset", "is_same_size", "_has_compatible_shallow_copy_type",
    "empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided",  # allocations, no kernel
}
# The operators that only move or convert data: a cast, a copy into a buffer, a clone.
COPY_OPS = ("_to_copy", "copy_", "clone")


class OpCounter(TorchDispatchMode):
    """Counts the aten operators dispatched while active, by name (``"mm"``, ``"_to_copy"``; overloads merged)."""

    def __init__(self):
        super().__init__()
        self.counts: Counter = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        if name not in _NO_KERNEL and not func.is_view:
            self.counts[name] += 1
        return func(*args, **(kwargs or {}))


def count_ops(fn, *args, **kwargs) -> Counter:
    """The aten operators ``fn(*args, **kwargs)`` dispatches (`OpCounter`), forward and any backward it runs."""
    with OpCounter() as counter:
        fn(*args, **kwargs)
    return counter.counts


@dataclass(frozen=True)
class OpCounts:
    """The operators of one model's training step: ``by_op`` {name: count}; `total` and `copies` (`COPY_OPS`)."""

    by_op: dict = field(default_factory=dict)

    @property
    def total(self) -> int:
        return sum(self.by_op.values())

    @property
    def copies(self) -> int:
        return sum(self.by_op.get(name, 0) for name in COPY_OPS)


def training_step_ops(model, batch: dict, dtype: torch.dtype | None = torch.bfloat16) -> OpCounts:
    """The operators of one forward + backward of ``model`` on ``batch`` (gradients cleared first), under autocast
    to ``dtype`` on the batch's device (None: no autocast). A first, uncounted step builds what models build once
    (the masks' shared tensors are per call; optimiser state is not involved)."""
    device = next(iter(batch.values())).device

    def step():
        model.zero_grad(set_to_none=True)
        with torch.autocast(device.type, dtype=dtype or torch.float32, enabled=dtype is not None):
            loss = model(**batch).loss
        loss.backward()

    model.train()
    if hasattr(model, "set_training_step"):  # (hf-attn models whose schedule follows the optimiser step)
        model.set_training_step(1)
    step()
    return OpCounts(dict(sorted(count_ops(step).items())))


def op_counts(presets, base: str = "marian", d_model: int = 64, layers: int = 2, heads: int = 4, ffn: int = 128,
              vocab: int = 200, batch: int = 4, src_len: int = 12, tgt_len: int = 10,
              dtype: torch.dtype | None = torch.bfloat16) -> dict[str, OpCounts]:
    """{``"stock"``: stock transformers with SDPA, preset: hf-attn}: each one's `training_step_ops` on the same
    padded batch, dropout off (a dropout mask is ops of its own; every model would add the same). Small sizes
    suffice: the counts depend on the layer count and the code path, not on the widths."""
    fields = {**config_fields(base, d_model, layers, heads, ffn, vocab, 512), **dropout_off()}
    data = padded_batch(vocab, batch, src_len, tgt_len)
    reference = build_hf_attn(base, "softmax", fields)
    out = {"stock": training_step_ops(build_stock(base, fields, reference), data, dtype)}
    for preset in presets:
        out[preset] = training_step_ops(build_hf_attn(base, preset, fields), data, dtype)
    return out


def render_op_counts(counts: dict[str, OpCounts]) -> str:
    """A Markdown table: operators and copies (`COPY_OPS`) per training step, and each one's excess over stock."""
    stock = counts["stock"]
    lines = ["| model | aten ops | vs stock | copies (_to_copy, copy_, clone) | vs stock |", "|---|---|---|---|---|"]
    for name, c in counts.items():
        lines.append(f"| {name} | {c.total} | {c.total - stock.total:+d} | {c.copies} | {c.copies - stock.copies:+d} |")
    return "\n".join(lines)
