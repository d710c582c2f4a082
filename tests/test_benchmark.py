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



def _load_benchmark():
    import importlib.util

    spec = importlib.util.spec_from_file_location("hf_attn_benchmark_script", ROOT / "scripts" / "benchmark.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_benchmark_long_mode(tmp_path):
    """--long in-process (a subprocess per memory run would cost an import each): rows per length and preset."""
    import torch

    bench = _load_benchmark()
    out = tmp_path / "long.json"
    argv = ["--presets", "reluformer", "--long", "8,24", "--long-batch", "1", "--d-model", "16", "--layers", "1",
            "--heads", "2", "--ffn", "32", "--vocab", "50", "--repeats", "1", "--no-memory", "--output", str(out)]
    threads = torch.get_num_threads()
    try:
        bench.main(argv)
        args = bench.parse_args([*argv, "--_memory-of", "reluformer", "--_memory-len", "24"])
        assert bench.long_peak_memory_mb(args) >= 0
    finally:
        torch.set_num_threads(threads)
    rows = json.loads(out.read_text())["long_rows"]
    assert [(r["length"], r["preset"]) for r in rows] == [
        (8, "softmax"), (8, "reluformer"), (24, "softmax"), (24, "reluformer")
    ]
    for r in rows:
        assert r["fwd_bwd_median_s"] > 0 and r["tokens_per_s"] > 0
        if r["preset"] == "softmax":
            assert r["fwd_bwd_ratio_vs_softmax"] == 1.0
    assert "| 24 | reluformer |" in (tmp_path / "long.md").read_text()


def test_benchmark_long_mode_rejects_bad_lengths(capsys):
    import pytest

    bench = _load_benchmark()
    for bad in ("128,x", "1"):
        with pytest.raises(SystemExit) as e:
            bench.parse_args(["--long", bad])
        assert e.value.code == 2 and "--long" in capsys.readouterr().err
