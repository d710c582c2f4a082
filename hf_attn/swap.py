"""Convert a vanilla Marian/BART checkpoint into the matching hf-attn model."""

from __future__ import annotations

import os

import torch
from transformers import AutoModelForSeq2SeqLM

from .modeling import PRESETS, HfAttnConfigError
from .modeling.configuration_hf_attn import unused_hyperparameters
from .modeling.bases import base_of

# config keys that describe the saved file, not the architecture
_NOT_ARCHITECTURE = {"model_type", "architectures", "auto_map", "transformers_version", "_name_or_path", "preset"}
_ATTENTION_KEYS = {f"{s}_attention{x}" for s in ("encoder", "decoder", "cross") for x in ("", "_layers")}


def _target_classes(model):
    base = base_of(model)
    if base is not None:
        return base.config_class, base.model_class
    raise HfAttnConfigError(
        f"swap_attention supports MarianMTModel and BartForConditionalGeneration, got {type(model).__name__}; "
        "load a Marian or BART seq2seq checkpoint"
    )


def swap_attention(model_or_path, preset: str = "rela-g", **overrides):
    """Return an hf-attn model with ``preset``'s attention, copying every weight it shares with the input.

    ``model_or_path`` is a `MarianMTModel` / `BartForConditionalGeneration` (or an hf-attn model) or a directory /
    Hub id of one (e.g. ``Helsinki-NLP/opus-mt-de-en``). Only the variant's new parameters are initialised;
    q/k/v/out projections, FFNs, norms and embeddings are copied exactly. ``overrides`` are config fields.
    """
    if isinstance(model_or_path, (str, os.PathLike)):
        model = AutoModelForSeq2SeqLM.from_pretrained(model_or_path)
    elif isinstance(model_or_path, torch.nn.Module):
        model = model_or_path
    else:
        raise HfAttnConfigError(
            f"swap_attention needs a model or a checkpoint path, got {type(model_or_path).__name__}"
        )
    config_cls, model_cls = _target_classes(model)
    base = {k: v for k, v in model.config.to_dict().items() if k not in _NOT_ARCHITECTURE | _ATTENTION_KEYS}
    # an hf-attn source carries every variant's hyperparameters: keep those of the variants the new preset uses
    unused = unused_hyperparameters(preset, {**base, **overrides}) if preset in PRESETS else {}
    base = {k: v for k, v in base.items() if k not in unused or k in overrides}
    config = config_cls.from_preset(preset, **{**base, **overrides})
    new = model_cls(config)
    missing, _unexpected = new.load_state_dict(model.state_dict(), strict=False)
    new_names = {n for n, _ in (*new.named_parameters(), *new.named_buffers())} - set(model.state_dict())
    not_copied = [n for n in missing if n not in new_names]
    if not_copied:  # a shared weight failed to transfer: never hand back a half-initialised model silently
        raise HfAttnConfigError(f"could not copy {len(not_copied)} weights from the checkpoint, e.g. {not_copied[0]}")
    new.generation_config = model.generation_config
    return new.to(dtype=next(model.parameters()).dtype, device=next(model.parameters()).device)
