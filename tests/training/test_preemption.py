"""Preemption: a signal to a real `hf-attn train` process saves the current step and exits 75; `--resume` then gives
the losses and weights of an uninterrupted run. The signalled commands are processes; the runs no signal reaches
(the uninterrupted reference, a single process's resume, the matrix run again) train in the test's process."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest
import torch
from conftest import kept_threads
from safetensors.torch import load_file
from training_helpers import REPO, TINY_ARGS, accelerate_cli, offline_env

from hf_attn.errors import PREEMPTED_EXIT

pytestmark = pytest.mark.slow
STEPS = 40
ARGS = ["train", "--preset", "reluformer", *TINY_ARGS, "--max_steps", str(STEPS), "--save_steps", "1000",
        "--eval_steps", "1000"]


def _train(out, *extra) -> int:
    """`hf-attn train` of ARGS in this process, on one thread as the signalled processes train: a run that needs no
    signal needs no interpreter of its own (the resumed run starts from the checkpoint's RNG and data state, not
    from the process's)."""
    from hf_attn.cli import main

    with kept_threads():
        torch.set_num_threads(1)
        return main([*ARGS, "--output_dir", str(out), *extra])


def _start(cmd, out_log):
    return subprocess.Popen(cmd, cwd=REPO, env=offline_env(), stdout=out_log, stderr=subprocess.STDOUT, text=True,
                            stdin=subprocess.DEVNULL)


def _wait_for_steps(log_path, n, proc, timeout=120):
    """Wait until the run has logged ``n`` training losses (logging_steps 1)."""
    end = time.time() + timeout
    while time.time() < end:
        if log_path.read_text(errors="replace").count("'loss'") >= n:
            return
        assert proc.poll() is None, log_path.read_text()[-3000:]
        time.sleep(0.05)
    raise AssertionError(f"no {n} logged steps in {timeout} s")


def _losses(out):
    return {step: loss for step, loss in json.loads((out / "results.json").read_text())["curves"]["train_loss"]}


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    out = tmp_path_factory.mktemp("reference") / "run"
    assert _train(out) == 0
    return out


@pytest.mark.parametrize("sig, after", [(signal.SIGTERM, 6), (signal.SIGINT, 10)])  # (an epoch is 8 steps)
def test_a_signal_saves_the_step_and_resume_is_exact(tmp_path, uninterrupted, sig, after):
    out, log = tmp_path / "run", tmp_path / "log.txt"
    with open(log, "w") as fh:
        proc = _start([sys.executable, "-m", "hf_attn.cli", *ARGS, "--output_dir", str(out)], fh)
        _wait_for_steps(log, after, proc)
        proc.send_signal(sig)
        time.sleep(0.02)
        proc.send_signal(signal.SIGTERM)  # a second signal (a scheduler repeating itself) changes nothing
        rc = proc.wait(timeout=120)
    text = log.read_text()
    assert rc == PREEMPTED_EXIT, text[-3000:]
    line = next(x for x in text.splitlines() if x.startswith("hf-attn: stopped by"))
    step = int(re.search(r"at step (\d+)", line).group(1))
    assert sig.name in line and f"checkpoint-{step}" in line and "--resume" in line and after <= step < STEPS
    ckpts = sorted(p.name for p in out.iterdir() if p.name.startswith("checkpoint-"))
    assert ckpts == [f"checkpoint-{step}"] and not (out / ".tmp-checkpoint").exists()

    assert _train(out, "--resume") == 0
    want, got = load_file(uninterrupted / "model.safetensors"), load_file(out / "model.safetensors")
    assert want.keys() == got.keys()
    for name in want:
        assert (want[name] == got[name]).all(), name
    ref, resumed = _losses(uninterrupted), _losses(out)
    assert all(resumed[s] == ref[s] for s in resumed if s > step) and max(resumed) == STEPS


def _launch(out, tmp_path, *extra):
    """`accelerate launch` with 2 CPU processes of the same tiny run (the tokenizer cache is shared)."""
    return accelerate_cli(*ARGS, "--per_device_train_batch_size", "8", "--output_dir", str(out),
                          "--cache_dir", str(tmp_path.parent / "tok"), *extra)


def test_two_processes_stop_at_the_same_step_and_resume_exactly(tmp_path):
    """Under `accelerate launch` a signal to one worker stops both at one step, after one checkpoint, and
    `--resume` under the same launch gives the losses and weights of an uninterrupted 2-process run. The signal
    comes after the first epoch (8 steps): the resumed epoch's permutation must be the one both processes drew."""
    reference = tmp_path / "reference"
    r = subprocess.run(_launch(reference, tmp_path), cwd=REPO, env=offline_env(), capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]

    out, log = tmp_path / "run", tmp_path / "log.txt"
    with open(log, "w") as fh:
        proc = _start(_launch(out, tmp_path), fh)
        _wait_for_steps(log, 10, proc, timeout=300)
        workers = subprocess.run(["pgrep", "-f", "--", f"--output_dir {out}"], capture_output=True, text=True).stdout.split()
        workers = [int(p) for p in workers if int(p) != proc.pid]
        assert workers, "no worker processes found"
        os.kill(workers[-1], signal.SIGUSR1)  # one process only: the others learn of it at the step's end
        rc = proc.wait(timeout=300)
    text = log.read_text()
    assert rc != 0 and text.count("hf-attn: stopped by") == 1, text[-3000:]
    step = int(re.search(r"stopped by .+? at step (\d+)", text).group(1))
    assert step < STEPS, "the run finished before the signal arrived"
    ckpts = [p.name for p in out.iterdir() if p.name.startswith("checkpoint-")]
    assert ckpts == [f"checkpoint-{step}"]
    state = json.loads((out / f"checkpoint-{step}" / "trainer_state.json").read_text())
    assert state["global_step"] == step and state["epoch"] > 1

    r = subprocess.run(_launch(out, tmp_path, "--resume"), cwd=REPO, env=offline_env(), capture_output=True,
                       text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    want, got = load_file(reference / "model.safetensors"), load_file(out / "model.safetensors")
    assert want.keys() == got.keys()
    for name in want:
        assert (want[name] == got[name]).all(), name
    ref, resumed = _losses(reference), _losses(out)
    assert all(resumed[s] == ref[s] for s in resumed if s > step) and max(resumed) == STEPS


def test_reproduce_passes_the_signal_on_and_resumes(tmp_path, capsys, monkeypatch):
    """SIGTERM to `hf-attn reproduce`: the running run saves a checkpoint, no new run starts, exit 75; the same
    command then finishes the matrix from that checkpoint."""
    from reproduce.in_process import reproduce_in_process, runs_in_this_process
    from training_helpers import bible_pairs, write_jsonl

    train = write_jsonl(tmp_path / "train.jsonl", bible_pairs(160))
    test = write_jsonl(tmp_path / "test.jsonl", bible_pairs(8, "test"))
    # batches of 2: the cheapest steps; 100 of them leave the signal seconds to arrive before the run would end (the
    # matrix passes it on within `runner.POLL_SECONDS`)
    args = ["reproduce", "--presets", "softmax,rela-g", "--pairs", "de-en", "--steps", "100", "--seeds", "1",
            "--output_dir", str(tmp_path / "results"), "--runs_dir", str(tmp_path / "runs"), "--sentences", "4",
            "--bootstrap", "100", "--threads", "1", "--", *TINY_ARGS, "--per_device_train_batch_size", "2",
            "--save_steps", "1000", "--eval_steps", "1000", "--train_file", str(train), "--validation_file", str(test),
            "--test_file", str(test)]
    cmd = [sys.executable, "-m", "hf_attn.cli", *args]
    log = tmp_path / "log.txt"
    with open(log, "w") as fh:
        proc = _start(cmd, fh)
        end = time.time() + 300
        run_log = None
        while time.time() < end and run_log is None:  # the first run's own log (the matrix writes its logs there)
            logs = list((tmp_path / "runs").glob("*.log")) if (tmp_path / "runs").is_dir() else []
            run_log = logs[0] if logs and logs[0].read_text(errors="replace").count("'loss'") >= 5 else None
            time.sleep(0.1)
        assert run_log is not None, log.read_text()[-3000:]
        proc.send_signal(signal.SIGTERM)
        rc = proc.wait(timeout=300)
    text = log.read_text()
    assert rc == PREEMPTED_EXIT and "hf-attn: stopped by SIGTERM" in text, text[-3000:]
    run_dir = tmp_path / "runs" / run_log.stem
    assert [p.name for p in run_dir.iterdir() if p.name.startswith("checkpoint-")]
    assert len(list((tmp_path / "runs").glob("*.log"))) == 1  # the second run never started
    # the same command again, in this process, its runs too (`reproduce.in_process`): the resume needs no process
    runs_in_this_process(monkeypatch)
    code, out, err = reproduce_in_process(args, capsys, monkeypatch)
    assert code == 0, err[-3000:]
    assert f"resuming {run_log.stem}" in out + err
    assert len(list((tmp_path / "results" / "runs").glob("*.json"))) == 2
