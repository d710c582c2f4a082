"""Two `hf-attn reproduce` matrices on one runs directory: each run is trained once, by one of them."""

from __future__ import annotations

import pytest
from training_helpers import bible_pairs


@pytest.mark.slow
def test_two_matrices_on_one_runs_dir_train_each_run_once(tmp_path):
    """Two `hf-attn reproduce` started together on the same --runs_dir / --output_dir: every run is trained by one
    of them (the other skips it), both finish, and the report is whole."""
    import subprocess
    import sys

    from training_helpers import REPO, TINY_ARGS, offline_env, write_jsonl

    train = write_jsonl(tmp_path / "train.jsonl", bible_pairs(160))
    test = write_jsonl(tmp_path / "test.jsonl", bible_pairs(8, "test"))
    cmd = [sys.executable, "-m", "hf_attn.cli", "reproduce", "--presets", "softmax,rela-g,rela-i", "--pairs", "de-en",
           "--steps", "20", "--seeds", "1", "--output_dir", str(tmp_path / "results"), "--runs_dir",
           str(tmp_path / "runs"), "--sentences", "4", "--bootstrap", "100", "--threads", "1", "--",
           *TINY_ARGS, "--train_file", str(train), "--validation_file", str(test), "--test_file", str(test)]
    procs = [subprocess.Popen(cmd, cwd=REPO, env=offline_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True) for _ in range(2)]
    outs = [p.communicate(timeout=600)[0] for p in procs]
    assert all(p.returncode == 0 for p in procs), outs
    trained = sum(log.read_text().count("[hf-attn] training ") for log in (tmp_path / "runs").glob("*.log"))
    assert trained == 3, outs
    assert len(list((tmp_path / "results" / "runs").glob("*.json"))) == 3
    assert "being trained by" in outs[0] + outs[1]
    report = (tmp_path / "results" / "REPORT.md").read_text()
    assert report.startswith("# hf-attn reproduction report") and report.count("# hf-attn reproduction report") == 1
