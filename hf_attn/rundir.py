"""Run directories (what `hf-attn train` writes): load the model and tokenizer, read the run's flags, recover the
pairs of the split it was trained and tested on. Shared by training, evaluation, analysis and the CLI; imports no
training code.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from transformers import AutoModelForSeq2SeqLM

from .data import load_corpus, load_tokenizer, read_parallel_file
from .data.bible import DEFAULT_TRANSLATION, pair_keys, resolve_translation
from .errors import HfAttnInputError
from .modeling.bases import register_auto_classes

SPLITS = ("test", "validation", "train")  # the splits of a run's data (run_pairs)


def read_run_args(run_dir: str | os.PathLike) -> dict:
    """hf-attn's flags of the run in ``run_dir`` (its run_args.json; {} when there is none)."""
    path = Path(run_dir) / "run_args.json"
    if not path.is_file():
        return {}
    try:
        return dict(json.loads(path.read_text(encoding="utf-8"))["hf_attn"])
    except (ValueError, KeyError, TypeError) as e:
        raise HfAttnInputError(f"{str(path)!r} is not a run_args.json written by `hf-attn train` ({type(e).__name__}: "
                               f"{str(e)[:80]}); restore it or remove it") from None


def run_arg(model_dir: str, key: str, default=None):
    """A flag of the `hf-attn train` run that wrote ``model_dir`` (its run_args.json), or ``default``."""
    return read_run_args(model_dir).get(key, default)


WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin", "model.safetensors.index.json", "pytorch_model.bin.index.json")


def weights_ok(d: Path) -> bool:
    """True when ``d`` holds model weights and a .safetensors file among them is as long as its header says."""
    d = Path(d)
    for name in WEIGHT_FILES:
        f = d / name
        if f.is_file():
            return name.endswith(".json") or name.endswith(".bin") or _safetensors_ok(f)
    return False


def _safetensors_ok(path: Path) -> bool:
    """True when the header of a .safetensors file is readable and the file is as long as the header says."""
    try:
        with open(path, "rb") as f:
            n = int.from_bytes(f.read(8), "little")
            header = json.loads(f.read(n))
        end = max((v["data_offsets"][1] for k, v in header.items() if k != "__metadata__"), default=0)
        return path.stat().st_size >= 8 + n + end
    except (OSError, ValueError, KeyError, TypeError, MemoryError, OverflowError):
        return False


def check_model_files(model_dir: str) -> Path:
    """config.json and complete weights, or one line saying what is missing or truncated (before any loading)."""
    d = Path(model_dir)
    if not (d / "config.json").is_file():
        raise HfAttnInputError(f"{model_dir!r} holds no config.json; give a directory written by `hf-attn train` or "
                               "save_pretrained")
    if not any((d / n).is_file() for n in WEIGHT_FILES):
        raise HfAttnInputError(f"{model_dir!r}: no model weights (model.safetensors); the run did not finish: resume "
                               "it with --resume, or give a directory written by `hf-attn train` or save_pretrained")
    if not weights_ok(d):
        raise HfAttnInputError(f"{model_dir!r}: model weights truncated or unreadable (model.safetensors is shorter "
                               "than its header says); copy or save the model again")
    return d


def load_model_dir(model_dir: str):
    """(model, tokenizer) of a run or ``save_pretrained`` directory; an hf-attn model loads as its own class. Missing
    or truncated weights, or weights that lack tensors the config needs, give one line."""
    register_auto_classes()
    d = check_model_files(model_dir)
    try:
        model, info = AutoModelForSeq2SeqLM.from_pretrained(str(d), output_loading_info=True)
        tokenizer = load_tokenizer(d)
    except HfAttnInputError:  # the tokenizer's own line, naming its files
        raise
    except Exception as e:  # noqa: BLE001 - transformers/safetensors/tokenizers raise many kinds; name the cause
        first = (str(e).strip().splitlines() or [type(e).__name__])[0][:200]
        raise HfAttnInputError(f"{model_dir!r}: cannot load the model or its tokenizer ({type(e).__name__}: {first}); "
                               "give a directory written by `hf-attn train` or save_pretrained") from None
    missing = info.get("missing_keys") or []
    if missing:
        raise HfAttnInputError(f"{model_dir!r}: its weights lack {len(missing)} tensor(s) the config needs (e.g. "
                               f"{sorted(missing)[0]}); give the directory the model was saved to")
    return model, tokenizer


def run_pairs(model_dir: str, split: str = "test", test_file: str | None = None, source=None, target=None,
              max_samples: int | None = None, flag: str = "--test_file"):
    """``(sources, references, description, run_args)``: the ``split`` of the data a run in ``model_dir`` was trained
    on (from its run_args.json), or the pairs of ``test_file`` (``flag``: the flag that named it, for its errors)."""
    if split not in SPLITS:
        raise HfAttnInputError(f"--split {split!r}: valid: {', '.join(SPLITS)}")
    prev = read_run_args(model_dir)
    source = source or prev.get("source")
    target = target or prev.get("target")
    if test_file:
        bible = prev.get("corpus") == "bible"  # its --source/--target are Bible codes, not the file's keys
        rows, s_key, t_key = read_parallel_file(test_file, None if bible else source, None if bible else target, flag)
        if bible and source and target:
            s_key, t_key = bible_file_keys(test_file, s_key, t_key, source, target, flag)
        if max_samples:
            rows = rows[:max_samples]
        if not rows:
            raise HfAttnInputError(f"{flag} {test_file!r} has no sentence pairs; give a file with at least one")
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


def bible_file_keys(test_file: str, s_key: str, t_key: str, source: str, target: str,
                    flag: str = "--test_file") -> tuple[str, str]:
    """(source key, target key) of the file ``test_file`` (named by ``flag``) for a model trained on the Bible's
    ``source`` -> ``target``: the run's language keys in the run's order when the file has them (``{"en": ...,
    "de": ...}`` is still de -> en); one line when the file's keys are other languages (it would be scored silently on
    the wrong pair); the file's own order for keys that name no language (``src``/``tgt``)."""
    want = pair_keys(resolve_translation(source), resolve_translation(target))
    if {s_key, t_key} == set(want):
        return want
    if any(key.split("_")[0].lower() in DEFAULT_TRANSLATION for key in (s_key, t_key)):
        raise HfAttnInputError(f"{flag} {test_file!r} has the keys {s_key!r} and {t_key!r}, but the model "
                               f"translates {want[0]} -> {want[1]}; give a file with {want[0]!r} and {want[1]!r} keys "
                               "(or a model trained on that pair)")
    return s_key, t_key
