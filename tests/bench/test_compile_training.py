"""scripts/compile_training.py: eager against compiled `hf-attn train` runs, end to end (the timings themselves are
not tested: they belong to the script's runs, not to a test)."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest
from training_helpers import TINY_ARGS

ROOT = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("compile_training", ROOT / "scripts" / "compile_training.py")
ct = importlib.util.module_from_spec(spec)
sys.modules["compile_training"] = ct  # (dataclasses look their module up while the file runs)
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
    # one training step: one dynamo compilation per compiled run (each later step's new batch shape recompiles,
    # about 20 s apiece on the CPU), and still a logged loss for the gap
    rc = ct.main(["--presets", "rela-g", "--steps", "1", "--rounds", "1", "--backend", "aot_eager", "--output",
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


def _result(tmp_path: Path) -> Path:
    data = {"settings": {"steps": 150, "rounds": 2, "backend": "inductor", "tolerance": 0.01, "margin": 0.05,
                         "side_by_side": True, "threads": 1, "extra": [], "torch": "2.13.0+cpu", "cpu_count": 2,
                         "command": "python scripts/compile_training.py --steps 150 --output r.json"},
            "presets": {"softmax": {"seconds": {"eager": [100.0, 110.0], "compiled": [80.0, 90.0]},
                                    "median_ratio": 1.24, "median_train_ratio": 1.31, "median_decode_ratio": 1.0,
                                    "loss_gap": 0.002}},
            "compile": {"softmax": True}}
    path = tmp_path / "r.json"
    path.write_text(json.dumps(data))
    return path


def test_docs_writes_the_table_into_the_page_block(tmp_path):
    page = tmp_path / "speed.md"
    page.write_text("intro\n" + ct.MARKERS[0] + "\nold\n" + ct.MARKERS[1] + "\nafter\n")
    assert ct.main(["--docs", str(page), "--from", str(_result(tmp_path))]) == 0
    text = page.read_text()
    assert text.startswith("intro\n" + ct.MARKERS[0]) and text.endswith(ct.MARKERS[1] + "\nafter\n")
    assert "| softmax | 105 / 85 | 1.24 | 1.31 | 1.00 | 2.0e-03 | yes |" in text
    assert "side by side, 1 torch thread(s) each" in text and "old" not in text


def test_docs_needs_from_and_an_existing_file(tmp_path, capsys):
    with pytest.raises(SystemExit):
        ct.main(["--docs", str(tmp_path / "speed.md")])
    assert "go together" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        ct.main(["--docs", str(tmp_path / "speed.md"), "--from", str(tmp_path / "missing.json")])
    assert "missing.json: no such file" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        ct.main(["--steps", "10"])
    assert "--output RESULT.json is needed" in capsys.readouterr().err


def test_side_by_side_times_each_run_to_its_own_end(tmp_path, monkeypatch):
    """A run that ends while the script still waits for its neighbour is timed to its own end, not to the
    neighbour's (the compiled run of a pair is waited for first in every other round)."""
    real_popen = ct.subprocess.Popen

    def fake_popen(cmd, **kw):  # the compiled run takes 1.5 s, the eager one 0.1 s
        out = Path(cmd[cmd.index("--output_dir") + 1])
        out.mkdir(parents=True)
        compiled = "--torch_compile" in cmd
        (out / "results.json").write_text(json.dumps({
            "training": {"torch_compile": compiled}, "train_seconds_this_run": 1.0, "decode_seconds": 0.5,
            "curves": {"train_loss": [[1, 2.0]]}}))
        return real_popen([ct.sys.executable, "-c", f"import time; time.sleep({1.5 if compiled else 0.1})"], **kw)

    monkeypatch.setattr(ct.subprocess, "Popen", fake_popen)
    result = ct.measure(["softmax"], 1, 2, "inductor", [], tmp_path, side_by_side=True, threads=1)["softmax"]
    assert all(t < 1.0 for t in result["seconds"]["eager"]), result["seconds"]  # round 2 waits for compiled first
    assert all(t >= 1.5 for t in result["seconds"]["compiled"])
    assert result["ratios"][0] == pytest.approx(result["ratios"][1], rel=0.5) and result["median_ratio"] < 1


def test_the_speed_page_block_regenerates_from_the_committed_results(monkeypatch):
    monkeypatch.chdir(ROOT)  # (the block names its files relative to the repository)
    page = (ROOT / ct.DOCS_PAGE).read_text()
    start, end = ct.MARKERS
    block = page[page.index(start) + len(start):page.index(end)].strip("\n")
    sources = block.splitlines()[0].split("--from ", 1)[1].split("`", 1)[0].split()
    assert sources and all((ROOT / s).is_file() for s in sources), "the block names no committed result"
    assert ct.docs_block(sources) == block, "rerun: python scripts/compile_training.py --docs --from " + " ".join(sources)
