"""scripts/compile_training.py: eager against compiled `hf-attn train` runs, end to end (the timings themselves are
not tested: they belong to the script's runs, not to a test)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
from training_helpers import TINY_ARGS

ROOT = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("compile_training", ROOT / "scripts" / "compile_training.py")
ct = importlib.util.module_from_spec(spec)
spec.loader.exec_module(ct)


def test_loss_gap_and_verdicts():
    assert ct.loss_gap([(1, 2.0), (2, 1.0)], [(1, 2.0), (2, 1.01), (3, 9.0)]) == pytest.approx(0.01)
    with pytest.raises(SystemExit, match="no common step"):
        ct.loss_gap([(1, 2.0)], [(2, 2.0)])
    result = {"fast": {"loss_gap": 0.001, "median_ratio": 1.3}, "drifts": {"loss_gap": 0.2, "median_ratio": 1.3},
              "slow": {"loss_gap": 0.0, "median_ratio": 1.02}}
    assert ct.verdicts(result, tolerance=0.01, margin=0.05) == {"fast": True, "drifts": False, "slow": False}


@pytest.mark.slow
@pytest.mark.parametrize("side_by_side", [False, True], ids=["one-after-the-other", "side-by-side"])
def test_a_tiny_measurement_end_to_end(tmp_path, monkeypatch, side_by_side):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    out = tmp_path / "compile.json"
    rc = ct.main(["--presets", "rela-g", "--steps", "4", "--rounds", "1", "--backend", "aot_eager", "--output",
                  str(out), *(["--side_by_side"] if side_by_side else []), "--", *TINY_ARGS])
    assert rc == 0
    data = json.loads(out.read_text())
    r = data["presets"]["rela-g"]
    assert len(r["seconds"]["eager"]) == len(r["seconds"]["compiled"]) == 1 and r["median_ratio"] > 0
    assert all(len(r[k]["eager"]) == 1 and r[k]["compiled"][0] >= 0 for k in ("train_seconds", "decode_seconds"))
    assert r["median_train_ratio"] > 0 and r["median_decode_ratio"] > 0
    assert r["loss_gap"] < 1e-4  # aot_eager runs the same kernels: the same losses
    assert data["settings"]["backend"] == "aot_eager" and set(data["compile"]) == {"rela-g"}
    assert data["settings"]["side_by_side"] is side_by_side
    assert data["settings"]["threads"] == (1 if side_by_side else None)


def test_bad_flags_are_one_line(capsys):
    with pytest.raises(SystemExit):
        ct.main(["--steps", "0", "--output", "x.json"])
    assert "--steps 0: must be at least 1" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        ct.main(["--side_by_side", "--threads", "0", "--output", "x.json"])
    assert "--threads 0: must be at least 1" in capsys.readouterr().err
