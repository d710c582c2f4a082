"""Helpers for the viewer tests: a word-level tokenizer for the tiny models of conftest, and viewer data of them."""

from __future__ import annotations

import torch

from conftest import EOS, VOCAB, tiny_model

# one preset per attention variant: together they cover every family of the viewer
VARIANT_PRESETS = {
    "softmax": "softmax", "sparsemax": "sparsemax", "entmax15": "entmax15", "rela": "rela-g", "gmm": "gmm",
    "recurrent": "ran-all", "hard-gaussian": "hard-gaussian", "synthesizer": "synthesizer", "reluformer": "reluformer",
    "calibrated": "calibration-gate",
}

SOURCES = [
    "im anfang war das wort und das wort war bei gott",
    "und gott sprach es werde licht",
    "die erde war wüst und leer und es war finster auf der tiefe",
    "selig sind die da geistlich arm sind",
]
REFERENCES = [
    "in the beginning was the word and the word was with god",
    "and god said let there be light",
    "the earth was without form and void",
    "blessed are the poor in spirit",
]


class WordTokenizer:
    """Words -> ids 3..VOCAB-1 by a fixed hash, then EOS: what the viewer asks of a tokenizer, for the tiny models."""

    def __init__(self, offset: int = 0):
        self.offset = offset  # another offset: another vocabulary

    def get_vocab(self) -> dict[str, int]:
        return {f"w{i + self.offset}": i for i in range(VOCAB)}

    def ids(self, text: str, max_length: int) -> list[int]:
        ids = [3 + sum(map(ord, word)) % (VOCAB - 3) for word in text.split()]
        return ids[: max_length - 1] + [EOS]

    def __call__(self, text, text_target=None, return_tensors="pt", truncation=True, max_length=64):
        src = self.ids(text, max_length)
        out = {"input_ids": torch.tensor([src]), "attention_mask": torch.ones(1, len(src), dtype=torch.long)}
        if text_target is not None:
            out["labels"] = torch.tensor([self.ids(text_target, max_length)])
        return out

    def convert_ids_to_tokens(self, ids) -> list[str]:
        return [f"w{i + self.offset}" for i in ids]


def viewed(preset: str, name: str | None = None, seed: int = 0, sentences: int = 2, tokenizer=None):
    """A `ViewedModel` of a tiny random Marian model with ``preset``."""
    from hf_attn.analysis.viewer import ViewedModel

    model = tiny_model("marian", preset, seed=seed)
    return ViewedModel(name or preset, model, tokenizer or WordTokenizer(), preset,
                       ["and god said"] * sentences)


def tiny_viewer_data(*presets: str, sentences: int = 2, seed: int = 0) -> dict:
    """The viewer's data for tiny random models of ``presets`` (side by side) on the first ``sentences`` pairs."""
    from hf_attn.analysis.viewer import viewer_data

    models = [viewed(p, seed=seed, sentences=sentences) for p in presets]
    return viewer_data(models, SOURCES[:sentences], REFERENCES[:sentences], "tiny random models")


def stock_model_dir(base: str, path, cache_dir, seed: int = 0):
    """A plain transformers directory, as a user's own baseline is: the stock MarianMTModel /
    BartForConditionalGeneration of the tiny architecture (random weights) and a SentencePiece tokenizer trained on
    the viewer's sentences (offline, well under a second), both written with save_pretrained into ``path``."""
    from conftest import TINY

    from hf_attn.data import get_tokenizer
    from hf_attn.modeling import BASES

    tokenizer, _ = get_tokenizer((SOURCES + REFERENCES) * 5, base, vocab_size=60, cache_dir=cache_dir)
    special = dict(pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id,
                   forced_eos_token_id=tokenizer.eos_token_id)
    if base == "marian":
        special.update(decoder_start_token_id=tokenizer.pad_token_id)
    else:
        special.update(bos_token_id=tokenizer.bos_token_id, decoder_start_token_id=tokenizer.eos_token_id,
                       forced_bos_token_id=None)
    b = BASES[base]
    torch.manual_seed(seed)
    model = b.stock_model_class(b.stock_config_class(**{**TINY, **special, "vocab_size": len(tokenizer)}))
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path
