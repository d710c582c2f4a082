"""Tokenisation for seq2seq training: explicit length filtering (train) or truncation (evaluation), right padding."""

from __future__ import annotations

from transformers import DataCollatorForSeq2Seq

from ..errors import HfAttnInputError


def tokenize_split(dataset, tokenizer, source_lang: str, target_lang: str, max_source_length: int = 128,
                   max_target_length: int = 128, filter_long: bool = True, max_length_ratio: float | None = None,
                   desc: str = "tokenizing"):
    """``input_ids``/``attention_mask``/``labels``/``length`` columns.

    ``filter_long``: drop pairs longer than the limits (training); otherwise truncate to them (evaluation loss).
    ``max_length_ratio``: also drop pairs whose token lengths differ by more than this factor (misaligned verses).
    """
    if max_source_length < 2 or max_target_length < 2:
        raise HfAttnInputError(
            f"--max_source_length {max_source_length} / --max_target_length {max_target_length}: need at least 2 tokens"
        )
    tokenizer.padding_side = "right"

    def encode(batch):
        src = [x[source_lang] for x in batch["translation"]]
        tgt = [x[target_lang] for x in batch["translation"]]
        trunc = not filter_long
        enc = tokenizer(src, text_target=tgt, truncation=trunc, max_length=max_source_length if trunc else None)
        if trunc:
            enc["labels"] = [ids[: max_target_length - 1] + ids[-1:] if len(ids) > max_target_length else ids
                             for ids in enc["labels"]]
        enc["length"] = [len(x) for x in enc["input_ids"]]
        return enc

    out = dataset.map(encode, batched=True, remove_columns=dataset.column_names, desc=desc)
    if filter_long:
        def keep(ex):
            s, t = len(ex["input_ids"]), len(ex["labels"])
            if s > max_source_length or t > max_target_length:
                return False
            if max_length_ratio and max(s, t) > max_length_ratio * min(s, t) and max(s, t) > 8:
                return False
            return True

        n = len(out)
        out = out.filter(keep, desc="filtering long or misaligned pairs")
        dropped = n - len(out)
        if dropped:
            print(f"[hf-attn] data: dropped {dropped} of {n} training pairs longer than {max_source_length}/"
                  f"{max_target_length} tokens" + (f" or with a length ratio over {max_length_ratio}" if max_length_ratio else ""),
                  flush=True)
        if len(out) == 0:
            raise HfAttnInputError(
                f"every training pair is longer than --max_source_length {max_source_length} / --max_target_length "
                f"{max_target_length} tokens; raise those limits"
            )
    return out


def make_collator(tokenizer, model=None):
    """Right padding, labels padded with -100 (ignored by the loss); ``decoder_input_ids`` from the model."""
    tokenizer.padding_side = "right"
    return DataCollatorForSeq2Seq(tokenizer, model=model, padding="longest", label_pad_token_id=-100,
                                  return_tensors="pt")
