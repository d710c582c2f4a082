"""A signal during a retrofit child's step 0 stops it with the runner's "stopped, resumes" exit, not a kill."""

import os
import signal

import pytest

from hf_attn.errors import PREEMPTED_EXIT, HfAttnPreempted
from hf_attn.reproduce import run_extras


@pytest.mark.parametrize("name", ["SIGTERM", "SIGINT", "SIGUSR1"])
def test_a_signal_during_step_0_raises_preempted_and_the_handlers_come_back(name):
    before = signal.getsignal(getattr(signal, name))
    with pytest.raises(HfAttnPreempted, match=f"stopped by {name} during child's step 0; nothing of it is kept") as e:
        with run_extras.stop_raises("child's step 0"):
            os.kill(os.getpid(), getattr(signal, name))
    assert e.value.exit_code == PREEMPTED_EXIT
    assert signal.getsignal(getattr(signal, name)) is before


def test_step_0_runs_under_the_signal_handlers(monkeypatch, tmp_path):
    seen = {}

    def swap_and_score(spec, runs_dir, parent, out, done):
        seen["handler"] = signal.getsignal(signal.SIGTERM)
        return {}, []

    monkeypatch.setattr(run_extras, "_swap_and_score", swap_and_score)
    monkeypatch.setattr(run_extras, "step_zero_dir", lambda spec, runs_dir: tmp_path / "child.step0")
    (tmp_path / "parent").mkdir()
    (tmp_path / "parent" / "results.json").write_text("{}")
    spec = type("Spec", (), {"name": "child", "parent": "parent"})()
    assert run_extras.step_zero(spec, tmp_path) == ({}, [])
    assert seen["handler"] not in (signal.SIG_DFL, signal.getsignal(signal.SIGTERM))
