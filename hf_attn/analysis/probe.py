"""Does a model read its source? Its loss on true pairs against the same targets behind another sentence's source.

A model that ignores the source (an attention collapse the ReLA-g runs once showed) scores the same loss on both;
one that translates scores clearly lower on the true pairs. The sources are rotated by one pair, so every target
meets a real but wrong source of the same corpus.
"""

from __future__ import annotations

import torch


@torch.no_grad()
def mean_target_loss(model, tokenizer, sources, references, batch_size: int = 32, max_length: int = 128) -> float:
    """Token-level cross-entropy (nats, no label smoothing) of ``references`` given ``sources``, teacher forcing."""
    model.eval()
    total, count = 0.0, 0
    for start in range(0, len(sources), batch_size):
        enc = tokenizer(sources[start : start + batch_size], text_target=references[start : start + batch_size],
                        padding=True, truncation=True, max_length=max_length, return_tensors="pt")
        labels = enc["labels"].masked_fill(enc["labels"] == tokenizer.pad_token_id, -100)
        logits = model(input_ids=enc["input_ids"], attention_mask=enc["attention_mask"], labels=labels).logits
        loss = torch.nn.functional.cross_entropy(logits.float().flatten(0, 1), labels.flatten(), reduction="sum")
        total += float(loss)
        count += int(labels.ne(-100).sum())
    return total / max(count, 1)


def source_probe(model, tokenizer, sources, references, batch_size: int = 32, max_length: int = 128) -> dict:
    """``{"loss_true", "loss_shuffled", "gap", "sentences"}``: ``gap`` = shuffled - true (0 = the source is ignored)."""
    if len(sources) < 2:
        raise ValueError("source_probe needs at least two sentence pairs to shuffle")
    rotated = sources[1:] + sources[:1]
    true = mean_target_loss(model, tokenizer, sources, references, batch_size, max_length)
    shuffled = mean_target_loss(model, tokenizer, rotated, references, batch_size, max_length)
    return {"loss_true": round(true, 4), "loss_shuffled": round(shuffled, 4), "gap": round(shuffled - true, 4),
            "sentences": len(sources)}
