"""Checkpoints that are all there or not there, the newest complete one, and the lock on an output directory.

* `HfAttnSeq2SeqTrainer` writes ``checkpoint-N`` under ``.tmp-checkpoint/`` and renames it into ``--output_dir``
  when complete, so a kill during a save leaves no half-written ``checkpoint-N`` behind.
* `newest_complete_checkpoint` is what ``--resume`` and the "already holds" check use; it skips (and names)
  incomplete checkpoints written by older versions or by other tools.
* `RunLock`: one run per output directory. The lock file stores the PID and host; a lock of a dead process on this
  host is stale and taken over. Under ``accelerate launch`` only the main process (RANK 0) takes it.
"""

from __future__ import annotations

import json
import os
import re
import socket
import time
from pathlib import Path

import torch
from safetensors.torch import load_file

from ..errors import HfAttnBusy, HfAttnInputError
from ..rundir import weights_ok

TMP_DIR = ".tmp-checkpoint"
_CHECKPOINT = re.compile(r"^checkpoint-(\d+)$")
def is_complete(d: str | os.PathLike) -> bool:
    d = Path(d)
    return (d / "trainer_state.json").is_file() and (d / "config.json").is_file() and weights_ok(d)


def newest_complete_checkpoint(output_dir: str | os.PathLike) -> tuple[str | None, list[str]]:
    """(path of the newest complete ``checkpoint-N``, names of the newer incomplete ones skipped)."""
    out = Path(output_dir)
    if not out.is_dir():
        return None, []
    found = sorted(((int(m.group(1)), p) for p in out.iterdir() if p.is_dir() and (m := _CHECKPOINT.match(p.name))),
                   reverse=True)
    skipped = []
    for _, p in found:
        if is_complete(p):
            return str(p), skipped
        skipped.append(p.name)
    return None, skipped


# -------------------------------------------------------------------------------------------------------- lock
def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process
        return True
    return True


class RunLock:
    """``--output_dir``/.hf_attn.lock: a second run in the same directory stops with one clear line."""

    NAME = ".hf_attn.lock"

    def __init__(self, output_dir: str | os.PathLike):
        self.path = Path(output_dir) / self.NAME
        self.held = False

    def acquire(self) -> "RunLock":
        if os.environ.get("RANK", "0") != "0":  # another process of the same (accelerate/torchrun) run
            return self
        me = {"pid": os.getpid(), "host": socket.gethostname(), "started": time.strftime("%Y-%m-%d %H:%M:%S")}
        for _ in range(2):
            try:
                fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except FileExistsError:
                self._check_stale()
                continue
            with os.fdopen(fd, "w") as f:
                json.dump(me, f)
            self.held = True
            return self
        raise HfAttnInputError(f"--output_dir {str(self.path.parent)!r}: cannot take the lock {self.path.name}; "
                               "remove it if no run uses that directory")

    def _owner(self) -> tuple[dict, int | None, str | None, bool]:
        """(lock file contents, pid, host, whether that process is alive); pid None when unreadable."""
        try:
            info = json.loads(self.path.read_text())
            pid, host = int(info["pid"]), str(info["host"])
        except (OSError, ValueError, KeyError, TypeError):
            return {}, None, None, False
        return info, pid, host, host != socket.gethostname() or _alive(pid)

    def _check_stale(self) -> None:
        info, pid, host, live = self._owner()
        if live:
            raise HfAttnBusy(
                f"--output_dir {str(self.path.parent)!r} is in use by process {pid} on {host} (since "
                f"{info.get('started', '?')}); wait for it, choose another --output_dir, or delete "
                f"{self.path} if that process is gone"
            )
        print(f"[hf-attn] removing the stale lock {self.path} ({'process ' + str(pid) + ' is gone' if pid else 'unreadable'})",
              flush=True)
        try:
            self.path.unlink()
        except FileNotFoundError:
            pass

    def holder(self) -> dict | None:
        """The lock's owner ({"pid", "host", "started"}) while a live process holds it, else None."""
        info, _, _, live = self._owner()
        return info if live else None

    def release(self) -> None:
        if self.held:
            self.held = False
            try:
                self.path.unlink()
            except FileNotFoundError:
                pass

    def __enter__(self):
        return self.acquire()

    def __exit__(self, *exc):
        self.release()


# -------------------------------------------------------------------------------------------------- averaging
def complete_checkpoints(output_dir: str | os.PathLike) -> list[tuple[int, Path]]:
    """Every complete ``checkpoint-N`` of ``output_dir``, oldest first."""
    out = Path(output_dir)
    found = sorted((int(m.group(1)), p) for p in out.iterdir() if p.is_dir() and (m := _CHECKPOINT.match(p.name)))
    return [(step, p) for step, p in found if is_complete(p)]


def checkpoint_weights(d: Path) -> dict:
    """The tensors of a checkpoint's ``model.safetensors``."""
    path = Path(d) / "model.safetensors"
    if not path.is_file():
        raise HfAttnInputError(f"{str(d)!r} has no model.safetensors to average; give checkpoints saved by `hf-attn train`")
    return load_file(str(path))


def average_weights(model, states: list[dict]) -> None:
    """Load the element-wise mean of ``states`` into ``model`` (floating tensors averaged in float32; integer buffers,
    e.g. a step counter, taken from the newest state). Checkpoint averaging as in Vaswani et al. 2017 (Sec. 6.1).
    Every trainable model tensor must come from the states, directly or through a tied weight (fixed tensors such
    as Marian's sinusoidal positions are not saved, and stay as they are)."""
    keys = [k for k in states[-1] if all(k in s for s in states)]
    avg = {}
    for k in keys:
        t = states[-1][k]
        avg[k] = (torch.stack([s[k].float() for s in states]).mean(0).to(t.dtype) if t.is_floating_point() else t)
    missing, unexpected = model.load_state_dict(avg, strict=False)
    loaded = {model.state_dict()[k].data_ptr() for k in avg if k in model.state_dict()}
    fixed = {k for k, p in model.named_parameters() if not p.requires_grad}
    untied = [k for k in missing if k not in fixed and model.state_dict()[k].data_ptr() not in loaded]
    if untied or unexpected:
        name = (untied or unexpected)[0]
        raise HfAttnInputError(f"cannot average these checkpoints: tensor {name!r} is "
                               f"{'missing from' if untied else 'not in the model but in'} them; average checkpoints of "
                               "one run")


def average_last_checkpoints(model, output_dir: str | os.PathLike, n: int, final_step: int) -> list[str]:
    """Average the final weights (``model``) with the newest complete checkpoints of ``output_dir`` up to
    ``final_step``, ``n`` sets of weights in all (a checkpoint of ``final_step`` is the final weights); returns what
    was averaged, oldest first ("final" for the model's own weights when no checkpoint holds them)."""
    ckpts = [(s, p) for s, p in complete_checkpoints(output_dir) if s <= final_step]
    if ckpts and ckpts[-1][0] == final_step:
        ckpts = ckpts[-n:]
        names, states = [p.name for _, p in ckpts], [checkpoint_weights(p) for _, p in ckpts]
    else:
        ckpts = ckpts[-(n - 1):] if n > 1 else []
        names = [p.name for _, p in ckpts] + ["final"]
        states = [checkpoint_weights(p) for _, p in ckpts] + [{k: v.detach().clone() for k, v in model.state_dict().items()}]
    if len(states) > 1:
        average_weights(model, states)
    return names
