"""Run directories (what `hf-attn train` writes): load the model and tokenizer, read the run's flags, recover the
pairs of the split it was trained and tested on. Shared by training, evaluation, analysis and the CLI; imports no
training code.
"""

from __future__ import annotations

import json
from pathlib import Path

from .errors import HfAttnInputError


def run_arg(model_dir: str, key: str, default=None):
    """A flag of the `hf-attn train` run that wrote ``model_dir`` (its run_args.json), or ``default``."""
    path = Path(model_dir) / "run_args.json"
    if not path.is_file():
        return default
    return json.loads(path.read_text(encoding="utf-8")).get("hf_attn", {}).get(key, default)


def load_model_dir(model_dir: str):
    """(model, tokenizer) of a run or ``save_pretrained`` directory; an hf-attn model loads as its own class."""
    from transformers import AutoModelForSeq2SeqLM

    from . import swap_attention  # noqa: F401  (registers the hf-attn Auto classes)
    from .data import load_tokenizer

    d = Path(model_dir)
    if not (d / "config.json").is_file():
        raise HfAttnInputError(f"{model_dir!r} holds no config.json; give a directory written by `hf-attn train` or "
                               "save_pretrained")
    model, info = AutoModelForSeq2SeqLM.from_pretrained(str(d), output_loading_info=True)
    missing = info.get("missing_keys") or []
    if missing:
        raise HfAttnInputError(f"{model_dir!r}: its weights lack {len(missing)} tensor(s) the config needs (e.g. "
                               f"{sorted(missing)[0]}); give the directory the model was saved to")
    return model, load_tokenizer(d)


def run_pairs(model_dir: str, split: str = "test", test_file: str | None = None, source=None, target=None,
              max_samples: int | None = None):
    """``(sources, references, description, run_args)``: the ``split`` of the data a run in ``model_dir`` was trained
    on (from its run_args.json), or the pairs of ``test_file``."""
    from .data import load_corpus, read_parallel_file

    if split not in ("test", "validation", "train"):
        raise HfAttnInputError(f"--split {split!r}: valid: test, validation, train")
    d = Path(model_dir)
    prev = {}
    if (d / "run_args.json").is_file():
        prev = json.loads((d / "run_args.json").read_text())["hf_attn"]
    source = source or prev.get("source")
    target = target or prev.get("target")
    if test_file:
        rows, s_key, t_key = read_parallel_file(test_file, source if prev.get("corpus") != "bible" else None,
                                                None if prev.get("corpus") == "bible" else target, "test")
        if max_samples:
            rows = rows[:max_samples]
        if not rows:
            raise HfAttnInputError(f"--test_file {test_file!r} has no sentence pairs; give a file with at least one")
        src = [r["translation"][s_key] for r in rows]
        ref = [r["translation"][t_key] for r in rows]
        return src, ref, test_file, prev
    if not prev:
        raise HfAttnInputError(f"{model_dir!r} has no run_args.json to find its data; give --test_file FILE")
    corpus = load_corpus(prev.get("corpus"), source, target, prev.get("train_file"), prev.get("validation_file"),
                         prev.get("test_file"), prev.get("dataset"), prev.get("dataset_config_name"),
                         {"train": prev.get("max_train_samples"), split: max_samples})
    src, ref = corpus.pairs(split)
    return src, ref, f"{split} split of {corpus.description}", prev
