"""One process of the two-process FSDP test (tests/training/test_fsdp.py), launched by `torch.distributed.run` on CPU (gloo).

For each preset given (comma-separated), one after the other in the same process group: shards a tiny hf-attn model
with torch's FSDP2 (`fully_shard`), wrapping the layer classes the documentation's FSDP command names, trains it a few
SGD steps on one batch per process, gathers the full state dict and saves it with `save_pretrained` (rank 0) to
OUT/<preset>. One launch for every preset: the processes start (and import torch and transformers) once."""

from __future__ import annotations

import sys

import torch
import torch.distributed as dist
from conftest import tiny_batch, tiny_model

import hf_attn
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard


STEPS, LR = 3, 0.05  # plain SGD: the weights differ from one process's exactly as the gradients do
OVERRIDES = {"ran_attention_dropout": 0.0}  # RAN presets: no randomness, the same updates as the one-process reference


def overrides(preset: str) -> dict:
    """OVERRIDES where the preset runs RAN (another preset refuses a RAN hyperparameter)."""
    sites = {v for k, v in hf_attn.PRESETS[preset].overrides.items() if k.endswith("_attention")}
    return OVERRIDES if "recurrent" in sites else {}


def main(presets: str, wrap: str, out: str) -> None:
    dist.init_process_group("gloo")
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    for preset in presets.split(","):
        train_and_save(preset, wrap, f"{out}/{preset}", mesh)
    dist.destroy_process_group()


def train_and_save(preset: str, wrap: str, out: str, mesh) -> None:
    rank = dist.get_rank()
    model = tiny_model("marian", preset, **overrides(preset)).train()
    wrapped = [m for m in model.modules() if type(m).__name__ in wrap.split(",")]
    assert wrapped, f"no module of the classes {wrap} in the model"
    for module in wrapped:
        fully_shard(module, mesh=mesh)
    fully_shard(model, mesh=mesh)
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    batch = tiny_batch(batch=4, seed=rank)  # a different batch on each process
    for _ in range(STEPS):
        loss = model(**batch).loss
        loss.backward()  # FSDP averages the gradients over the processes
        optimizer.step()
        optimizer.zero_grad()
        assert torch.isfinite(loss.detach()).all(), float(loss.detach())
    state = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if rank == 0:
        plain = tiny_model("marian", preset, **overrides(preset))
        missing, unexpected = plain.load_state_dict(state, strict=False)
        assert not unexpected and all("position" in n for n in missing), (missing, unexpected)
        plain.save_pretrained(out)
        print(f"saved {len(state)} tensors to {out}", flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:4])
