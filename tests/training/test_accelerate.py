"""`hf-attn train` under `accelerate launch` with two CPU processes (DistributedDataParallel over gloo)."""

from __future__ import annotations

import json
import subprocess

import pytest
from training_helpers import TINY_ARGS, accelerate_cli, offline_env

PRESETS = ["rela-g"]  # variants with auxiliary losses or step-driven state add themselves here


@pytest.mark.slow
@pytest.mark.parametrize("preset", PRESETS)
def test_two_process_accelerate_launch(tmp_path, preset):
    out = tmp_path / preset
    cmd = accelerate_cli("train", "--preset", preset, *TINY_ARGS, "--per_device_train_batch_size", "8",
                         "--max_steps", "4", "--save_steps", "2", "--output_dir", str(out),
                         "--cache_dir", str(tmp_path / "tok"))
    p = subprocess.run(cmd, env=offline_env(), capture_output=True, text=True, timeout=600, stdin=subprocess.DEVNULL)
    assert p.returncode == 0, p.stderr[-4000:]
    r = json.loads((out / "results.json").read_text())
    assert r["world_size"] == 2 and r["training"]["world_size"] == 2, r["world_size"]
    assert r["train_steps"] == 4 and r["preset"] == preset
    # the main process alone reports and writes: one summary line, one results file, every Hub file
    assert p.stdout.count(f"[hf-attn] {preset}: BLEU") == 1, p.stdout[-3000:]
    state = json.loads((out / "checkpoint-4" / "trainer_state.json").read_text())
    assert state["global_step"] == 4 and state["train_batch_size"] == 8
    for name in ("config.json", "model.safetensors", "README.md", "tokenizer_config.json"):
        assert (out / name).is_file(), name


@pytest.mark.slow
def test_dispatch_batches_across_processes_is_one_error_line(tmp_path):
    """accelerate's dispatch_batches concatenates the processes' batches, which hf-attn pads to different lengths:
    one line before any work (was a tensor-size traceback at the first step)."""
    cmd = accelerate_cli("train", "--preset", "softmax", *TINY_ARGS, "--max_steps", "2", "--accelerator_config",
                         json.dumps({"dispatch_batches": True}), "--output_dir", str(tmp_path / "out"),
                         "--cache_dir", str(tmp_path / "tok"))
    p = subprocess.run(cmd, env=offline_env(), capture_output=True, text=True, timeout=600, stdin=subprocess.DEVNULL)
    lines = [x for x in p.stderr.splitlines() if x.startswith("hf-attn: error: ")]
    assert p.returncode != 0 and lines, p.stderr[-3000:]
    assert all(x.startswith("hf-attn: error: --accelerator_config dispatch_batches true") for x in lines), lines
    assert "drop dispatch_batches" in lines[0] and "Sizes of tensors" not in p.stderr  # (the launcher's own
    # ChildFailedError report follows: accelerate prints it for any worker that exits non-zero)
    assert not (tmp_path / "tok").exists()  # refused before the tokenizer was trained
