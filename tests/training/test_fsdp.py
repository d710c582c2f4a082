"""FSDP: the layer classes the documentation tells FSDP to wrap exist in every hf-attn model; a model sharded with torch's
FSDP2 over two CPU processes trains to the same weights as one process on the same data and reloads; and `hf-attn
train --fsdp` on CPU processes stops with one line (accelerate would silently run DDP there: docs/training.md, "Several
processes and GPUs")."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from accelerate.utils import FullyShardedDataParallelPlugin
from conftest import tiny_batch, tiny_model
from training_helpers import TINY_ARGS, cli_in_process, offline_env
from transformers import Seq2SeqTrainingArguments

import hf_attn

ROOT = Path(__file__).resolve().parents[2]
TRAINING = (ROOT / "docs" / "training.md").read_text()


def documented_wrap_classes() -> dict[str, list[str]]:
    """{"marian": [...], "bart": [...]}: the page's fsdp_config and the BART classes named beside it."""
    section = TRAINING.split("## Several processes and GPUs", 1)[1].split("\n## ", 1)[0]
    marian = json.loads(re.search(r"--fsdp_config '(\{.*?\})'", section).group(1))["transformer_layer_cls_to_wrap"]
    bart = re.search(r"BART: (\w+) / (\w+)", section).groups()
    return {"marian": marian, "bart": list(bart)}


@pytest.mark.parametrize("base", ["marian", "bart"])
@pytest.mark.parametrize("preset", ["calibration-gate", "ran-all", "gmm", "reluformer"])
def test_the_documented_wrap_classes_are_the_models_layers(base, preset, tmp_path):
    """The documentation's --fsdp_config, through Trainer's arguments and accelerate's FSDP plugin, as a GPU launch uses it."""
    model = tiny_model(base, preset)
    names = documented_wrap_classes()[base]
    args = Seq2SeqTrainingArguments(output_dir=str(tmp_path), fsdp=True,
                                    fsdp_config=json.dumps({"transformer_layer_cls_to_wrap": names}))
    plugin = FullyShardedDataParallelPlugin(**args.fsdp_plugin_args)
    plugin.set_auto_wrap_policy(model)  # raises "Could not find the transformer layer class ..." for a wrong name
    classes = plugin.auto_wrap_policy.keywords["transformer_layer_cls"]
    assert sorted(c.__name__ for c in classes) == sorted(names)
    # every attention module sits inside a wrapped layer (RAN's per-stack matrices belong to the encoder/decoder)
    layers = [m for m in model.modules() if isinstance(m, tuple(classes))]
    assert len(layers) == model.config.encoder_layers + model.config.decoder_layers
    inside = {id(a) for layer in layers for a in layer.modules()}
    assert all(id(a) in inside for a in model.attention_modules())


def train_like_the_processes(preset: str, steps: int, lr: float, **overrides):
    """One process, the two processes' batches: the mean of their losses has the gradient FSDP averages."""
    model = tiny_model("marian", preset, **overrides).train()
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    batches = [tiny_batch(batch=4, seed=rank) for rank in (0, 1)]
    for _ in range(steps):
        loss = sum(model(**b).loss for b in batches) / len(batches)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    return model.eval()


def launch_fsdp_workers(presets: list[str], out: Path) -> tuple[int, str, str]:
    """`torch.distributed.run` with two CPU processes of tests/training/fsdp_worker.py, which train and save each
    preset in turn to ``out/<preset>``; (exit code, stdout, stderr)."""
    wrap = ",".join(documented_wrap_classes()["marian"])
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
           str(Path(__file__).with_name("fsdp_worker.py")), ",".join(presets), wrap, str(out)]
    env = offline_env(PYTHONPATH=f"{ROOT / 'tests'}{os.pathsep}{ROOT}")
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            stdin=subprocess.DEVNULL, start_new_session=True)
    try:
        stdout, stderr = proc.communicate(timeout=300)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # torchrun and both workers
        stdout, stderr = proc.communicate()
    return proc.returncode, stdout, stderr


FSDP_PRESETS = ["ran-all", "reluformer-no-reg", "reluformer", "calibration-gate"]


@pytest.fixture(scope="module")
def fsdp_launch(tmp_path_factory):
    """One two-process launch that trains every preset of FSDP_PRESETS (the processes start once, not per preset):
    (exit code, stdout, stderr, the directory of the presets' saved models)."""
    out = tmp_path_factory.mktemp("fsdp")
    return (*launch_fsdp_workers(FSDP_PRESETS, out), out)


@pytest.mark.slow
@pytest.mark.parametrize("preset", FSDP_PRESETS)
def test_fsdp_two_cpu_processes_match_one_process_and_reload(preset, fsdp_launch):
    """ran-all: one attention matrix and transition shared by all layers of a stack (owned by the encoder /
    decoder, outside the wrapped layers); reluformer-no-reg: ReLUFormer's attention without its regulariser;
    reluformer and calibration-gate: auxiliary objectives computed inside the sharded layers and gathered in the
    forward pass's state object (ReLUFormer's per-layer regulariser; calibration's mask penalty and its perturbed
    decoder pass, a second call of every decoder layer with theta frozen inside the call, where FSDP has gathered
    the layer's parameters). Had FSDP rebuilt that state object between layers, or had the perturbed pass swapped
    in detached parameters from outside the layers, the layers below the top one would barely move."""
    from . import fsdp_worker

    code, stdout, stderr, root = fsdp_launch
    assert code == 0, stdout[-2000:] + stderr[-4000:]
    out = root / preset
    reloaded = type(tiny_model("marian", preset)).from_pretrained(out).eval()
    reference = train_like_the_processes(preset, fsdp_worker.STEPS, fsdp_worker.LR, **fsdp_worker.overrides(preset))
    start = tiny_model("marian", preset, **fsdp_worker.overrides(preset)).state_dict()
    moved = 0
    for name, value in reference.state_dict().items():
        torch.testing.assert_close(reloaded.state_dict()[name], value, rtol=1e-4, atol=1e-6, msg=name)
        moved += int(not torch.equal(value, start[name]))
    assert moved > 10  # it trained
    if preset == "ran-all":
        assert all(not torch.equal(reference.model.encoder.ran_stack.state_dict()[k], v) for k, v in
                   tiny_model("marian", preset).model.encoder.ran_stack.state_dict().items())
    batch = tiny_batch()
    with torch.no_grad():
        torch.testing.assert_close(reloaded(**batch).logits, reference(**batch).logits, rtol=1e-4, atol=1e-5)



@pytest.mark.slow
def test_fsdp_on_cpu_processes_is_one_error_line(tmp_path, capsys, monkeypatch):
    # (in this process: the flags are checked before any work; TrainingArguments sets this variable for --fsdp, and
    # the test puts it back)
    monkeypatch.delenv("FSDP_CPU_RAM_EFFICIENT_LOADING", raising=False)
    fsdp_config = json.dumps({"transformer_layer_cls_to_wrap": documented_wrap_classes()["marian"]})
    code, err = cli_in_process(["train", *TINY_ARGS, "--max_steps", "1", "--fsdp", "--fsdp_config", fsdp_config,
                                "--output_dir", str(tmp_path / "out")], capsys)
    assert code == 2, err[-2000:]
    assert err.strip().splitlines()[-1].startswith("hf-attn: error: --fsdp: FSDP needs GPU processes"), err
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())


@pytest.mark.slow
def test_accelerate_use_fsdp_on_cpu_is_one_error_line(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("ACCELERATE_USE_FSDP", "true")  # what `accelerate launch --use_fsdp` sets
    code, err = cli_in_process(["train", *TINY_ARGS, "--max_steps", "1", "--output_dir", str(tmp_path / "out")], capsys)
    assert code == 2 and "FSDP needs GPU processes" in err, err[-2000:]
    assert hf_attn  # (imported for the Auto registration in tiny_model's reload)


def test_fsdp_leaves_the_forward_state_alone():
    """FSDP2 rebuilds the dataclasses, dicts and lists among a layer's arguments that hold tensors needing gradients
    (to hook its backward on them). The forward pass's state object reaches every layer that way, and holds such
    tensors after the first layer (ReLUFormer's statistics): it must pass through as itself, or the layers after
    the first write to a copy that the model never reads."""
    from torch.distributed.fsdp._common_utils import collect_grad_tensors, replace_grad_tensors

    from hf_attn.modeling.forward_state import FORWARD_STATE_KWARG, ForwardState

    state = ForwardState()
    state.layer_stats[("reluformer", "encoder", 0)] = {"norm": torch.ones(2, requires_grad=True) * 2}
    kwargs = {FORWARD_STATE_KWARG: state, "attention_mask": None}
    assert collect_grad_tensors(((), kwargs)) == ()
    assert replace_grad_tensors(((), kwargs), iter(()))[1][FORWARD_STATE_KWARG] is state
