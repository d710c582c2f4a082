"""scripts/benchmark.py runs end to end and reports ratios against softmax measured in the same run."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_benchmark_smoke(tmp_path):
    out = tmp_path / "bench.json"
    cmd = [
        sys.executable, str(ROOT / "scripts" / "benchmark.py"), "--presets", "rela-g", "--d-model", "32",
        "--layers", "1", "--heads", "2", "--ffn", "64", "--vocab", "100", "--batch", "4", "--src-len", "6",
        "--tgt-len", "5", "--decode-batch", "2", "--decode-len", "3", "--repeats", "2", "--output", str(out),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads(out.read_text())
    rows = {r["preset"]: r for r in result["rows"]}
    assert list(rows) == ["softmax", "rela-g"]
    assert rows["softmax"]["train_ratio_vs_softmax"] == 1.0
    for r in rows.values():
        assert r["train_median_s"] > 0 and r["decode_median_s"] > 0 and r["train_peak_mem_mib"] >= 0
    assert "| rela-g |" in (tmp_path / "bench.md").read_text()


def test_benchmark_rejects_unknown_preset():
    proc = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "benchmark.py"), "--presets", "nope"], capture_output=True, text=True
    )
    assert proc.returncode == 2 and "unknown preset 'nope'" in proc.stderr
