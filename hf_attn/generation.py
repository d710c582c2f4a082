"""Batched beam-search translation with a progress bar (sorted by length for speed, original order kept)."""

from __future__ import annotations

import torch
from tqdm.auto import tqdm

from .errors import HfAttnInputError


def decoding_settings(model, num_beams: int | None = None, length_penalty: float | None = None) -> tuple[int, float]:
    """(beams, length penalty): the given values, else the model's generation config (what its run used), else 4, 1."""
    gc = model.generation_config
    beams = num_beams or gc.num_beams or 4
    return beams, (length_penalty if length_penalty is not None else (gc.length_penalty or 1.0))


def translate_texts(model, tokenizer, texts: list[str], num_beams: int = 4, length_penalty: float = 1.0,
                    batch_size: int = 32, max_source_length: int = 256, max_new_tokens: int | None = None,
                    progress: bool = True, desc: str = "translating") -> list[str]:
    if num_beams < 1:
        raise HfAttnInputError(f"--num_beams {num_beams}: need at least 1")
    if max_new_tokens is None:  # what `hf-attn train` stored: generation_config.max_length = max_new_tokens + 2
        gc_max = getattr(model.generation_config, "max_length", None)
        max_new_tokens = gc_max - 2 if gc_max and gc_max > 2 else 256
    model.eval()
    tokenizer.padding_side = "right"
    order = sorted(range(len(texts)), key=lambda i: -len(texts[i]))
    out: list[str | None] = [None] * len(texts)
    bar = tqdm(total=len(texts), desc=desc, unit="sent", disable=not progress or not texts)
    with torch.inference_mode():
        for start in range(0, len(order), batch_size):
            idx = order[start:start + batch_size]
            batch = [texts[i] if texts[i].strip() else "" for i in idx]
            enc = tokenizer(batch, return_tensors="pt", padding=True, truncation=True, max_length=max_source_length)
            enc = {k: v.to(model.device) for k, v in enc.items() if k in ("input_ids", "attention_mask")}
            limit = min(max_new_tokens, int(enc["input_ids"].shape[1] * 2) + 10)
            try:
                gen = model.generate(**enc, num_beams=num_beams, length_penalty=length_penalty, max_length=limit + 2,
                                     early_stopping=True if num_beams > 1 else False)
            except (RuntimeError, MemoryError) as e:
                if not out_of_memory(e):
                    raise
                bar.close()
                raise HfAttnInputError(
                    f"out of memory translating a batch of {len(idx)} sentences with {num_beams} beams ("
                    f"{(str(e).strip().splitlines() or [type(e).__name__])[0][:160]}); lower --num_beams (now "
                    f"{num_beams}) or --batch_size (now {batch_size})") from None
            for i, text in zip(idx, tokenizer.batch_decode(gen, skip_special_tokens=True)):
                out[i] = text.strip() if texts[i].strip() else ""
            bar.update(len(idx))
    bar.close()
    return [x or "" for x in out]


def out_of_memory(e: BaseException) -> bool:
    """Whether ``e`` is running out of memory: Python's, torch's on the GPU, or its CPU allocator's."""
    text = str(e).lower()
    return isinstance(e, (MemoryError, torch.OutOfMemoryError)) or "out of memory" in text or \
        "can't allocate memory" in text
