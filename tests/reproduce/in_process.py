"""`hf-attn reproduce` in the test's own process, for the tests where a fresh interpreter proves nothing: the matrix
(`reproduce_in_process`) and, with `runs_in_this_process`, its runs too. A run is then the child's own entry point,
`runner._child`, called here instead of in ``python -m hf_attn.reproduce.runner`` (the same argument list, its
output to the run's log, its exit code as the child's), so the matrix's scheduling, resuming, records and report
are what a real matrix does; only the interpreter starts (a few seconds each: torch and transformers) are saved.

The runs as child processes, and what only processes show (a signal passed on, a run directory locked by another
matrix, the slot script), are tested with real processes: tests/training/test_preemption.py,
tests/reproduce/test_shared_runs_dir.py and the converged slot in tests/reproduce/test_converged.py."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import traceback
from types import SimpleNamespace

import torch
from conftest import kept_threads
from training_helpers import offline_env

# what `training_helpers.offline_env` sets for a command run as a process
COMMAND_ENV = ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TOKENIZERS_PARALLELISM", "OMP_NUM_THREADS", "PYTHONPATH")


def reproduce_in_process(args, capsys, monkeypatch) -> tuple[int, str, str]:
    """``hf-attn ARGS`` (a `reproduce` or `train` command line) through the command's `main` in this process, in the
    environment `training_helpers.run_cli` gives a command (offline, one thread, this checkout on PYTHONPATH, which
    the matrix's child processes inherit): (exit code, stdout, stderr)."""
    from hf_attn.cli import main

    env = offline_env()
    for key in COMMAND_ENV:
        monkeypatch.setenv(key, env[key])
    capsys.readouterr()
    with kept_threads():
        torch.set_num_threads(1)
        code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


class _RunHere:
    """Stands in for the `subprocess.Popen` of one run that `runner._start` makes: runs `runner._child` with the
    child's argument list at once, its stdout and stderr into the run's log, with the thread count the child's
    environment asks for (``HF_ATTN_THREADS``); an exception is a traceback in the log and exit code 1, as in a
    child process. ``returncode`` is the child's exit code."""

    def __init__(self, cmd, stdout, stderr=None, env=None):
        from hf_attn.reproduce import runner

        assert cmd[1:3] == ["-m", "hf_attn.reproduce.runner"], cmd
        threads = (env or {}).get("HF_ATTN_THREADS")
        with kept_threads(), contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stdout):
            saved = os.environ.get("HF_ATTN_THREADS")
            if threads:
                os.environ["HF_ATTN_THREADS"] = threads
            try:
                self.returncode = runner._child(list(cmd[3:]))
            except Exception:  # noqa: BLE001 - what a child process would print before exiting with 1
                traceback.print_exc(file=stdout)
                traceback.print_exc(file=sys.__stderr__)  # and in the test's captured output, should it fail
                self.returncode = 1
            finally:
                if saved is None:
                    os.environ.pop("HF_ATTN_THREADS", None)
                else:
                    os.environ["HF_ATTN_THREADS"] = saved
            stdout.flush()

    def poll(self) -> int:
        return self.returncode

    def wait(self, timeout=None) -> int:
        return self.returncode

    def send_signal(self, signum) -> None:  # the run has ended by the time the matrix could pass a signal on
        pass


def runs_in_this_process(monkeypatch) -> None:
    """From now until the test ends, the runs of a matrix started in this process (`reproduce_in_process`) run here,
    one after the other, instead of in child processes (`_RunHere`)."""
    from hf_attn.reproduce import runner

    monkeypatch.setattr(runner, "subprocess", SimpleNamespace(Popen=_RunHere, STDOUT=subprocess.STDOUT))
