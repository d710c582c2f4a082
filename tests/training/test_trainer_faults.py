"""The trainer under faults: checkpoints appear only when complete, the data order of a mid-epoch resume, divergence at
any step, the output-directory lock, and a full disk (one error line, the last complete checkpoint kept)."""

from __future__ import annotations

import json
import math
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from transformers.trainer_utils import get_last_checkpoint

from hf_attn.errors import HfAttnInputError
from hf_attn.training import HfAttnSeq2SeqTrainer
from tiny_trainer import data, make_trainer
from training_helpers import REPO, offline_env

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.mark.slow
def test_a_checkpoint_appears_only_when_complete(tmp_path, monkeypatch):
    def killed(self, output_dir):
        raise SystemExit("kill -9 while saving")

    t = make_trainer(tmp_path, max_steps=2, save_strategy="steps", save_steps=1, save_total_limit=1)
    monkeypatch.setattr(HfAttnSeq2SeqTrainer, "_save_rng_state", killed)
    with pytest.raises(SystemExit):
        t.train()
    assert not (tmp_path / "checkpoint-1").exists()  # the half-written save is not visible under its name
    assert get_last_checkpoint(str(tmp_path)) is None
    monkeypatch.undo()
    t = make_trainer(tmp_path, max_steps=3, save_strategy="steps", save_steps=1, save_total_limit=2)
    t.train()
    names = sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("checkpoint"))
    assert names == ["checkpoint-2", "checkpoint-3"]  # rotation still keeps save_total_limit
    assert (tmp_path / "checkpoint-3" / "model.safetensors").is_file()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".tmp")]


@pytest.mark.slow
def test_newest_complete_checkpoint_skips_incomplete_ones(tmp_path):
    from hf_attn.training.checkpoints import newest_complete_checkpoint

    t = make_trainer(tmp_path, max_steps=2, save_strategy="steps", save_steps=1)
    t.train()
    (tmp_path / "checkpoint-5").mkdir()
    (tmp_path / "checkpoint-5" / "config.json").write_text("{}")
    shutil.copytree(tmp_path / "checkpoint-2", tmp_path / "checkpoint-4")
    (tmp_path / "checkpoint-4" / "model.safetensors").write_bytes(b"\x00" * 10)  # truncated
    last, skipped = newest_complete_checkpoint(tmp_path)
    assert last == str(tmp_path / "checkpoint-2") and skipped == ["checkpoint-5", "checkpoint-4"]


@pytest.mark.slow
@pytest.mark.parametrize("lr", [1e6])
def test_a_non_finite_loss_at_any_step_stops_training(tmp_path, lr):
    # logging every 25 steps, 3 steps: the old check only saw logged losses (and Trainer filters NaN out of them)
    t = make_trainer(tmp_path, max_steps=6, learning_rate=lr, logging_steps=25, warmup_steps=0, max_grad_norm=0)
    t.train()
    assert t.diverged is not None
    step, loss = t.diverged
    assert step < 6 and not math.isfinite(loss)
    assert t.state.global_step == step  # stopped at once


@pytest.mark.slow
def test_mid_epoch_resume_restores_the_data_order(tmp_path):
    """group_by_length draws a permutation per epoch from the global RNG: a resumed run must see the same one."""
    from hf_attn.training.trainer import InterruptAfterSteps

    def run(out, stop=None, resume=None):
        t = make_trainer(out, ds=data(n=40), max_steps=12, save_strategy="steps", save_steps=7,
                         train_sampling_strategy="group_by_length", per_device_train_batch_size=8)
        if stop:
            t.add_callback(InterruptAfterSteps(stop))
        seen = []
        orig = t.compute_loss

        def spy(model, inputs, *a, **k):
            seen.append(inputs["input_ids"][:, 0].tolist())
            return orig(model, inputs, *a, **k)

        t.compute_loss = spy
        t.train(resume_from_checkpoint=resume)
        return t, seen

    full, order_full = run(tmp_path / "full")
    with pytest.raises(KeyboardInterrupt):  # 5 steps per epoch: checkpoint-7 is mid-way through epoch 2
        run(tmp_path / "part", stop=8)
    torch.manual_seed(123)  # the resumed process's RNG is elsewhere (other model init, other data loading)
    resumed, order_resumed = run(tmp_path / "part", resume=str(tmp_path / "part" / "checkpoint-7"))
    assert order_resumed == order_full[7:]
    for (k, a), b in zip(full.model.state_dict().items(), resumed.model.state_dict().values()):
        torch.testing.assert_close(a, b, msg=k)


def test_the_sampler_draws_as_the_stock_one_in_one_process():
    """One process: the same order as transformers' `LengthGroupedSampler` from the same RNG state, epoch after
    epoch (the runs in results/ were trained with it)."""
    from transformers.trainer_pt_utils import LengthGroupedSampler

    from hf_attn.training.trainer import ResumableLengthGroupedSampler

    lengths = [(7 * i) % 23 + 1 for i in range(40)]
    orders = {}
    for cls in (LengthGroupedSampler, ResumableLengthGroupedSampler):
        torch.manual_seed(0)
        sampler = cls(4, lengths=lengths)
        orders[cls] = [list(sampler) for _ in range(3)]
    assert orders[LengthGroupedSampler] == orders[ResumableLengthGroupedSampler]
    assert orders[LengthGroupedSampler][0] != orders[LengthGroupedSampler][1]


@pytest.mark.slow
def test_ddp_processes_draw_one_permutation_per_epoch(tmp_path):
    """Two processes whose global RNGs drift apart after the first epoch (dropout) still draw the same permutation
    every epoch: accelerate gives each process every second batch of its own, so differing permutations repeat some
    examples and skip others."""
    worker = Path(__file__).with_name("sampler_worker.py")
    env = {**offline_env(), "PYTHONPATH": os.pathsep.join([str(REPO), str(worker.parent.parent)])}
    r = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                        str(worker), str(tmp_path / "order")], cwd=REPO, env=env, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    zero, one = (json.loads((tmp_path / f"order.{rank}.json").read_text()) for rank in (0, 1))
    assert zero == one
    assert all(sorted(epoch) == list(range(40)) for epoch in zero) and zero[1] != zero[2]


@pytest.mark.slow
@pytest.mark.parametrize("where", ["checkpoint", "results"])
def test_a_full_disk_is_one_line_and_keeps_the_last_checkpoint(tmp_path, monkeypatch, capsys, where):
    """ENOSPC injected into the second checkpoint's weights, or into results.json: exit 2, one line naming the
    path, and the complete checkpoint before it untouched."""
    import errno

    import safetensors.torch
    import transformers.modeling_utils

    from hf_attn import io_utils
    from hf_attn.cli import main
    from training_helpers import TINY_ARGS

    out = tmp_path / "run"
    calls = {"n": 0}
    real_save, real_json = transformers.modeling_utils.safe_save_file, io_utils.write_json

    def full_save(tensors, filename, *a, **k):
        calls["n"] += 1
        if where == "checkpoint" and "checkpoint-4" in str(filename):
            raise OSError(errno.ENOSPC, "No space left on device", str(filename))
        return real_save(tensors, filename, *a, **k)

    def full_json(path, *a, **k):
        if where == "results" and str(path).endswith("results.json"):
            raise OSError(errno.ENOSPC, "No space left on device", str(path))
        return real_json(path, *a, **k)

    monkeypatch.setattr(transformers.modeling_utils, "safe_save_file", full_save)
    monkeypatch.setattr(safetensors.torch, "save_file", full_save)
    monkeypatch.setattr("hf_attn.training.run.write_json", full_json)
    rc = main(["train", "--preset", "rela-g", *TINY_ARGS, "--max_steps", "6", "--save_steps", "2",
               "--save_total_limit", "3", "--output_dir", str(out), "--cache_dir", str(tmp_path / "tok")])
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("hf-attn:")]
    assert rc == 2 and len(err) == 1 and "no space left on the device while writing" in err[0]
    assert (str(out / "results.json") if where == "results" else "checkpoint-4") in err[0]
    from hf_attn.training.checkpoints import is_complete

    assert is_complete(out / "checkpoint-2")
    if where == "checkpoint":
        assert not (out / "checkpoint-4").exists()


# ------------------------------------------------------------------------------------------------------ lock
def _dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


@pytest.mark.slow
def test_output_dir_lock(tmp_path, capsys):
    from hf_attn.training.checkpoints import RunLock

    lock = RunLock(tmp_path)
    lock.acquire()
    info = json.loads((tmp_path / RunLock.NAME).read_text())
    assert info["pid"] == os.getpid() and info["host"] == socket.gethostname()
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        (tmp_path / RunLock.NAME).write_text(json.dumps({"pid": sleeper.pid, "host": socket.gethostname()}))
        with pytest.raises(HfAttnInputError, match=rf"is in use by process {sleeper.pid} on {socket.gethostname()}"):
            RunLock(tmp_path).acquire()
    finally:
        sleeper.kill()
        sleeper.wait()
    (tmp_path / RunLock.NAME).write_text(json.dumps({"pid": _dead_pid(), "host": socket.gethostname()}))
    second = RunLock(tmp_path)
    second.acquire()  # a dead process's lock is stale
    assert "stale lock" in capsys.readouterr().out
    second.release()
    assert not (tmp_path / RunLock.NAME).exists()
    os.environ["RANK"] = "1"  # a second process of the same accelerate run takes no lock
    try:
        (tmp_path / RunLock.NAME).write_text(json.dumps({"pid": os.getppid(), "host": socket.gethostname()}))
        RunLock(tmp_path).acquire()
    finally:
        del os.environ["RANK"]
