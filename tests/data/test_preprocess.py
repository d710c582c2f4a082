"""Preprocessing (hf_attn/data/preprocess.py): length filtering or truncation of the tokenized pairs, and the
collator's right padding."""

from __future__ import annotations

import pytest
import torch

from hf_attn.data import get_tokenizer, load_corpus, make_collator, tokenize_split
from hf_attn.errors import HfAttnInputError
from training_helpers import bible_pairs


def test_length_filter_and_right_padding(tmp_path):
    pairs = bible_pairs(60)
    c = load_corpus(source="de", target="en", limits={"train": 60, "validation": 4, "test": 4})
    tok, _ = get_tokenizer([s for s, _ in pairs] + [t for _, t in pairs], vocab_size=300, cache_dir=tmp_path)
    full = tokenize_split(c.splits["train"], tok, "de", "en", 512, 512, filter_long=True)
    assert len(full) == 60
    lim = 30
    short = tokenize_split(c.splits["train"], tok, "de", "en", lim, lim, filter_long=True)
    expected = sum(1 for x in full if len(x["input_ids"]) <= lim and len(x["labels"]) <= lim)
    assert 0 < len(short) == expected < 60
    trunc = tokenize_split(c.splits["train"], tok, "de", "en", lim, lim, filter_long=False)
    assert len(trunc) == 60 and max(len(x["labels"]) for x in trunc) == lim
    assert all(x["labels"][-1] == tok.eos_token_id for x in trunc)
    with pytest.raises(HfAttnInputError, match="every training pair is longer"):
        tokenize_split(c.splits["train"], tok, "de", "en", 3, 3, filter_long=True)

    batch = make_collator(tok)([{k: short[i][k] for k in ("input_ids", "attention_mask", "labels")} for i in range(4)])
    lens = [len(short[i]["input_ids"]) for i in range(4)]
    for i, n in enumerate(lens):
        assert batch["attention_mask"][i, :n].all() and not batch["attention_mask"][i, n:].any()  # right padding
        assert (batch["input_ids"][i, n:] == tok.pad_token_id).all()
        m = len(short[i]["labels"])
        assert (batch["labels"][i, m:] == -100).all() and (batch["labels"][i, :m] >= 0).all()
    assert batch["input_ids"].dtype == torch.long
