"""The models and batches the benchmark and the compile check run: an hf-attn model of a preset, the stock
transformers model holding its weights, and random batches with padded rows.

Both bases (Marian and BART) are built from one table lookup, `model_classes`.
"""

from __future__ import annotations

import torch

from ..modeling.bases import get_base
from ..modeling.configuration_hf_attn import unused_hyperparameters
from ..modeling.registry import ATTENTION_VARIANTS

PAD, EOS, BOS = 1, 2, 0


def model_classes(base: str) -> tuple[type, type, type, type]:
    """(hf-attn config, hf-attn model, stock config, stock model) classes of ``base`` ("marian" or "bart")."""
    b = get_base(base)
    return b.config_class, b.model_class, b.stock_config_class, b.stock_model_class


def config_fields(base: str, d_model: int, layers: int, heads: int, ffn: int, vocab: int,
                  max_positions: int) -> dict:
    """The config fields shared by the stock and the hf-attn models: sizes (``layers`` in the encoder and the
    decoder each) and the special tokens the batches use."""
    return dict(
        vocab_size=vocab,
        d_model=d_model,
        encoder_layers=layers,
        decoder_layers=layers,
        encoder_attention_heads=heads,
        decoder_attention_heads=heads,
        encoder_ffn_dim=ffn,
        decoder_ffn_dim=ffn,
        max_position_embeddings=max_positions,
        pad_token_id=PAD,
        eos_token_id=EOS,
        forced_eos_token_id=None,
        decoder_start_token_id=PAD if base == "marian" else EOS,
        bos_token_id=BOS,
    )


def dropout_off() -> dict:
    """Config fields that turn every dropout off: the model's and the variants' own (e.g. RAN's)."""
    variant_dropouts = {h.name: 0.0 for cls in ATTENTION_VARIANTS.values() for h in cls.hyperparameters
                        if h.name.endswith("_dropout")}
    return {"dropout": 0.0, "attention_dropout": 0.0, **variant_dropouts}


def build_hf_attn(base: str, preset: str, fields: dict, seed: int = 0, device: str = "cpu"):
    """An hf-attn model of ``preset`` with the config ``fields``, initialised from ``seed``. The benchmark's settings
    for every variant (dropout off, block sizes) are kept where the preset uses the variant (`from_preset` refuses
    a hyperparameter of a variant the preset does not use)."""
    config_cls, model_cls, _, _ = model_classes(base)
    torch.manual_seed(seed)
    unused = unused_hyperparameters(preset, fields)
    return model_cls(config_cls.from_preset(preset, **{k: v for k, v in fields.items() if k not in unused})).to(device)


def build_stock(base: str, fields: dict, reference, device: str = "cpu"):
    """Stock transformers with SDPA, with the config ``fields`` and the weights of ``reference`` (an hf-attn
    softmax model of the same fields): both models then do identical work."""
    _, _, config_cls, model_cls = model_classes(base)
    torch.manual_seed(0)
    model = model_cls._from_config(config_cls(**fields), attn_implementation="sdpa")
    missing, unexpected = model.load_state_dict(reference.state_dict(), strict=False)
    if missing or unexpected:
        raise RuntimeError(f"stock model and hf-attn softmax differ in parameters: {missing} / {unexpected}")
    return model.to(device)


def padded_batch(vocab: int, n: int, src_len: int, tgt_len: int | None = None, pad_fraction: float = 0.25,
                 device: str = "cpu") -> dict:
    """Random ids (labels too if ``tgt_len``); a ``pad_fraction`` of the rows, spread evenly, shortened to a random
    length >= half and padded right. The same arguments give the same batch."""
    g = torch.Generator().manual_seed(n * 1000 + src_len)
    src = torch.randint(3, vocab, (n, src_len), generator=g)
    mask = torch.ones_like(src)
    labels = torch.randint(3, vocab, (n, tgt_len), generator=g) if tgt_len else None
    n_pad = round(n * pad_fraction)
    padded = torch.linspace(0, n - 1, n_pad).round().long().flip(0) if n_pad else torch.zeros(0, dtype=torch.long)
    for i in padded.tolist():
        keep = int(torch.randint(max(1, src_len // 2), src_len, (1,), generator=g)) if src_len > 1 else 1
        src[i, keep:], mask[i, keep:] = PAD, 0
        if labels is not None and tgt_len > 1:
            labels[i, int(torch.randint(max(1, tgt_len // 2), tgt_len, (1,), generator=g)):] = -100
    src[torch.arange(n), mask.sum(1) - 1] = EOS  # eos closes every source
    batch = {"input_ids": src, "attention_mask": mask}
    if labels is not None:
        batch["labels"] = labels
    return {k: v.to(device) for k, v in batch.items()}


def alternating_batch(vocab: int, n: int, src_len: int, tgt_len: int, seed: int = 1) -> dict:
    """Random ids and labels, every other row right-padded to a shorter length (a different one per row)."""
    g = torch.Generator().manual_seed(seed)
    src = torch.randint(3, vocab, (n, src_len), generator=g)
    labels = torch.randint(3, vocab, (n, tgt_len), generator=g)
    mask = torch.ones_like(src)
    for i in range(1, n, 2):
        keep = max(2, src_len - 1 - i % src_len)
        src[i, keep:], mask[i, keep:] = PAD, 0
        labels[i, max(2, tgt_len - i % tgt_len):] = -100
    src[torch.arange(n), mask.sum(1) - 1] = EOS
    return {"input_ids": src, "attention_mask": mask, "labels": labels}
