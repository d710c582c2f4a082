"""What one forward pass carries besides the tensors: `ForwardState` (the model's extra outputs, filled by the
layers) and `AttentionContext` (what a variant's ``attend`` may read besides q, k, v and keep)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .cache import HfAttnCache

FORWARD_STATE_KWARG = "hf_attn_state"  # the keyword under which the model hands its ForwardState to every layer


class ForwardState:
    """The extra outputs of one model forward pass, filled by the attention modules.

    The model creates one per call and passes it as ``hf_attn_state=...`` (transformers forwards keyword arguments
    through the stacks and layers to every attention module); the model-level hooks read it afterwards and the
    results become fields of `HfAttnSeq2SeqLMOutput`. Nothing outlives the call. Modules run outside the model's
    forward (e.g. the encoder inside ``generate``) get none.

    A plain class, not a dataclass or a dict: FSDP rebuilds the dataclasses and dicts among a layer's arguments
    that hold tensors needing gradients, so the layers after the first would write to copies the model never sees.
    """

    def __init__(self, details: dict | None = None, mode: str = "default") -> None:
        self.losses: dict = {}  # name -> [weighted loss tensors]
        self.logs: dict = {}  # name -> [scalar tensors], averaged into ``aux_logs``
        self.layer_stats: dict = {}  # (variant, site, layer) -> statistics for `model_losses`
        self.details = details  # "site.layer" -> {name: tensor}: the variants' internal maps, when asked for
        self.shared: dict = {}  # values computed once per pass and read by several layers (RAN)
        self.mode = mode  # "perturbed": attention calibration's perturbed decoder pass
        self.frozen: dict = {}  # id(layer) -> parameters a hook froze for one layer call

    def log(self, name: str, value: torch.Tensor) -> None:
        self.logs.setdefault(name, []).append(value.detach().float())

    def record(self, site: str, layer: int, maps: dict) -> None:
        """Keep ``maps`` (detached) under ``"site.layer"`` when the caller asked for the variants' details."""
        if self.details is not None:
            entry = self.details.setdefault(f"{site}.{layer}", {})
            entry.update({k: v.detach() for k, v in maps.items() if v is not None})



@dataclass
class AttentionContext:
    """What `VariantAttention.attend` may read besides q, k, v and keep, built once per call by `forward`."""

    hidden_states: torch.Tensor  # x, the layer's input [B, T, d]
    key_value_states: torch.Tensor | None  # cross-attention: the encoder states [B, S, d]; else None
    past: int  # target positions before this call during cached decoding (the query offset); 0 otherwise
    cache: HfAttnCache | None  # decoding state (`get_state` / `set_state`); None without a cache
    output_attentions: bool
    state: ForwardState | None  # the forward pass's extra outputs; None outside the model's forward

    @property
    def cached(self) -> bool:
        return self.cache is not None
