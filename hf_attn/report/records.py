"""The run records of a report's output directory and the test data they were scored on.

`load_records` reads ``runs/<name>.json`` with the test translations beside it; the test sources and references of
each record's data are cached in ``references/`` (`test_data_name`). `SeedComparisons` runs `seeds.seed_bootstrap` on
two lists of records once for every table and claim that asks.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from ..data import load_corpus
from ..data.arguments import DATA_ARGUMENTS
from ..errors import HfAttnInputError
from ..plans.matrix import RunSpec
from .seeds import seed_bootstrap


def load_records(output_dir: Path) -> list[dict]:
    out = []
    for path in sorted(Path(output_dir, "runs").glob("*.json")):
        rec = json.loads(path.read_text(encoding="utf-8"))
        hyp = path.with_suffix(".hyp.txt")
        rec["hypotheses"] = hyp.read_text(encoding="utf-8").splitlines() if hyp.is_file() else None
        out.append(rec)
    return out


# the `hf-attn train` flags that choose the test split: runs that agree on these (and on the pair) share it
DATA_FLAGS = tuple(f"--{name}" for name in DATA_ARGUMENTS if name not in ("source", "target"))


def _flag(text: str) -> str:
    """``--max-predict-samples=8`` -> ``--max_predict_samples``."""
    return "--" + text[2:].split("=", 1)[0].replace("-", "_")


def _flag_values(args: list[str]) -> list[tuple[str, str]]:
    """(flag, value text) for each ``--flag VALUE`` / ``--flag=VALUE`` of ``args``, in order (a flag without a value
    pairs with the next token: callers keep only flags that take one)."""
    return [(_flag(a), a.split("=", 1)[1] if "=" in a else args[i + 1]) for i, a in enumerate(args)
            if a.startswith("--") and ("=" in a or i + 1 < len(args))]


def test_data_name(record: dict) -> str:
    """The cache name of a record's test split: its pair, and a hash of the data flags it was given (if any), so that
    every seed, budget and recipe flag of one pair shares one file."""
    spec, args = record["spec"], list(record["spec"].get("train_args") or ())
    data = [f"{flag}={value}" for flag, value in _flag_values(args) if flag in DATA_FLAGS]
    extra = f"_x{hashlib.sha1(' '.join(data).encode()).hexdigest()[:6]}" if data else ""
    return f"{spec['source']}-{spec['target']}{extra}"


def data_arguments(argv: list[str]) -> dict:
    """The pair and the data flags (`DATA_FLAGS`) of an `hf-attn train` command line, typed as `DATA_ARGUMENTS`
    (`data/arguments.py`) declares them, None for those not given (the last of a repeated flag wins, as in the
    parser): the values `hf-attn train`'s parser gives them, read without it."""
    given = {flag[2:]: value for flag, value in _flag_values(argv) if flag[2:] in DATA_ARGUMENTS}
    out = {}
    for name, kind in DATA_ARGUMENTS.items():
        if name not in given:
            out[name] = None
            continue
        try:
            out[name] = kind(given[name])
        except ValueError:
            raise HfAttnInputError(f"--{name} {given[name]!r}: need {kind.__name__}") from None
    return out


def _test_split(output_dir: Path, record: dict) -> tuple[list[str], list[str]]:
    """The test sources and references of a record's data, read from its data and cached in ``references/``."""
    spec = dict(record["spec"], train_args=tuple(record["spec"].get("train_args") or ()))
    d = data_arguments(RunSpec(**spec).train_argv(Path("unused"), False))
    corpus = load_corpus(d["corpus"], d["source"], d["target"], d["train_file"], d["validation_file"], d["test_file"],
                         d["dataset"], d["dataset_config_name"], {"test": d["max_predict_samples"]})
    sources, refs = corpus.pairs("test")
    for suffix, lines in ((".src.txt", sources), (".txt", refs)):
        path = Path(output_dir, "references", test_data_name(record) + suffix)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return sources, refs


def _cached_split(output_dir: Path, record: dict, suffix: str, which: int) -> list[str]:
    path = Path(output_dir, "references", test_data_name(record) + suffix)
    if path.is_file():
        return path.read_text(encoding="utf-8").splitlines()
    return _test_split(output_dir, record)[which]


def references_for(output_dir: Path, record: dict) -> list[str]:
    """The test references of a record's data, cached in ``references/<pair>.txt`` (`test_data_name`)."""
    return _cached_split(output_dir, record, ".txt", 1)


def sources_for(output_dir: Path, record: dict) -> list[str]:
    """The test sources of a record's data, cached in ``references/<pair>.src.txt`` (`test_data_name`)."""
    return _cached_split(output_dir, record, ".src.txt", 0)


def shared_references(output_dir: Path, records: list[dict]) -> list[str]:
    """The test references of ``records``, which are compared sentence by sentence and so must share them."""
    refs = references_for(output_dir, records[0])
    for r in records[1:]:
        if references_for(output_dir, r) != refs:
            raise HfAttnInputError(f"{r['name']} and {records[0]['name']} have different test references: runs are "
                                   "compared only on the same test set")
    return refs


def relative_command(command: str, cwd: str | None = None) -> str:
    """``command`` with each absolute path made relative to ``cwd`` (default: the current directory) when it lies
    under it, else cut to ``.../<its last part>``: the report names no machine's directories."""
    cwd = os.path.abspath(cwd or os.getcwd())
    return " ".join(_relative_token(t, cwd) for t in command.split(" "))


def _relative_token(token: str, cwd: str) -> str:
    flag, eq, value = token.partition("=") if token.startswith("-") and "=" in token else ("", "", token)
    if not os.path.isabs(value):
        return token
    value = os.path.normpath(value)
    inside = os.path.commonpath([cwd, value]) == cwd
    return flag + eq + (os.path.relpath(value, cwd) if inside else os.path.join("...", os.path.basename(value)))


class SeedComparisons:
    """`seeds.seed_bootstrap` of two lists of complete records (two presets' runs, one per seed) on their shared
    test references; each pair of lists is computed once (the tables and the claims ask for the same ones)."""

    def __init__(self, output_dir: Path, n_samples: int, progress=None):
        self.output_dir, self.n_samples, self.done, self.progress = Path(output_dir), n_samples, {}, progress

    def __call__(self, a: list[dict], b: list[dict]) -> dict:
        key = (tuple(r["name"] for r in a), tuple(r["name"] for r in b))
        if key not in self.done:
            refs = shared_references(self.output_dir, a + b)
            self.done[key] = seed_bootstrap([r["hypotheses"] for r in a], [r["hypotheses"] for r in b], refs,
                                            self.n_samples)
            if self.progress is not None:  # a tqdm bar: one step per comparison computed
                self.progress.update()
        return self.done[key]
