"""The kernels a training step launches, counted without timing (hf_attn/bench/op_count.py): the aten operators of one
forward + backward under bfloat16 autocast, per preset against stock transformers Marian with SDPA.

On a GPU a small model's step is bound by the host issuing kernels, so every needless cast or copy costs wall time.
The bounds below are the counts of the current code (1 encoder + 1 decoder layer: 3 attention sites): a change that
adds a cast or a copy to a variant fails here. When a change removes some, lower the bound to the new count
(``python scripts/op_counts.py --layers 1 --presets ...`` prints them)."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import load_script

from hf_attn.bench.op_count import COPY_OPS, count_ops, op_counts, render_op_counts
from hf_attn.modeling.attention_rela import rela_norm

# preset: (most extra copies, most extra operators) than stock, per training step of the 1+1-layer model.
# softmax does exactly stock's work; the position-only variants (no q/k projections) copy less than stock.
BOUNDS = {
    "softmax": (0, -17),
    "sparsemax": (45, 119),
    "entmax15": (36, 143),
    "rela-g": (33, 137),
    "relu": (27, 32),
    "reluformer": (48, 319),
    "ran-all": (-9, 7),
    "hard-gaussian": (-10, -27),
    "synthesizer": (-11, -21),
}


@pytest.fixture(scope="module")
def counts():
    return op_counts(list(BOUNDS), layers=1)


def test_the_counter_counts_casts_and_copies_not_views():
    x = torch.randn(4, 8)
    assert count_ops(lambda: x.float()) == {}  # already float32: no op at all
    assert count_ops(lambda: x.bfloat16()) == {"_to_copy": 1}
    assert count_ops(lambda: x.t().contiguous()) == {"clone": 1}
    assert count_ops(lambda: x.view(2, 16).transpose(0, 1)[0]) == {}  # views launch nothing
    assert set(COPY_OPS) == {"_to_copy", "copy_", "clone"}


@pytest.mark.parametrize("preset", list(BOUNDS))
def test_extra_copies_and_operators_per_preset_are_bounded(counts, preset):
    stock, c = counts["stock"], counts[preset]
    most_copies, most_ops = BOUNDS[preset]
    assert stock.copies > 0 and stock.total > stock.copies
    assert c.copies - stock.copies <= most_copies, (preset, c.copies - stock.copies, render_op_counts(counts))
    assert c.total - stock.total <= most_ops, (preset, c.total - stock.total, render_op_counts(counts))


def test_rela_norm_under_autocast_casts_once():
    """LN(o) of a bfloat16 o under autocast: float32 math by type promotion, one cast back, no float32 copy of o."""
    o = torch.randn(2, 5, 32).bfloat16()
    gain, gate = torch.ones(32), torch.rand(32)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        ops = count_ops(rela_norm, o, "rmsnorm", 1e-8, gain, None, gate)
        y = rela_norm(o, "rmsnorm", 1e-8, gain, None, gate)
    assert ops["_to_copy"] == 1 and y.dtype == torch.bfloat16
    z = o.float()
    ref = z * torch.rsqrt(z.square().mean(-1, keepdim=True) + 1e-8) * torch.sigmoid(gate * z)
    torch.testing.assert_close(y, ref.bfloat16())


def test_op_counts_script_prints_the_table_and_writes_json(tmp_path, capsys):
    script = load_script("op_counts")
    out = tmp_path / "counts.json"
    counts = script.main(["--presets", "relu", "--layers", "1", "--by-op", "--output", str(out)])
    printed = capsys.readouterr().out
    assert "| relu |" in printed and "relu: " in printed and set(counts) == {"stock", "relu"}
    assert json.loads(out.read_text())["relu"] == counts["relu"].by_op
    with pytest.raises(SystemExit):
        script.main(["--presets", "relu-typo"])
