"""Corpora (hf_attn/data/corpus.py): Bible pairs of one language, local JSON lines / TSV / parallel files, and
`datasets` datasets, with one clear error for each kind of bad input."""

from __future__ import annotations

import pytest

from hf_attn.data import load_corpus
from hf_attn.errors import HfAttnInputError
from training_helpers import bible_pairs, write_jsonl


def test_same_language_pair_keys():
    c = load_corpus(source="k", target="4", limits={"train": 5, "validation": 2, "test": 2})
    assert (c.source_lang, c.target_lang) == ("en_k", "en_4")
    assert c.sizes() == {"train": 5, "validation": 2, "test": 2}


def test_files_jsonl_tsv_parallel(tmp_path):
    pairs = bible_pairs(30)
    write_jsonl(tmp_path / "train.jsonl", pairs)
    write_jsonl(tmp_path / "test.jsonl", pairs[:4])
    c = load_corpus(train_file=str(tmp_path / "train.jsonl"), test_file=str(tmp_path / "test.jsonl"))
    assert (c.source_lang, c.target_lang) == ("de", "en")
    assert c.sizes() == {"train": 29, "validation": 1, "test": 4}  # validation held out: last 5%
    assert c.pairs("test")[1][0] == pairs[0][1]

    (tmp_path / "train.tsv").write_text("de\ten\n" + "".join(f"{s}\t{t}\n" for s, t in pairs))
    c = load_corpus(train_file=str(tmp_path / "train.tsv"), validation_file=str(tmp_path / "test.jsonl"))
    assert (c.source_lang, c.target_lang) == ("de", "en") and c.sizes()["train"] == 30
    assert c.pairs("train")[0][0] == pairs[0][0]

    (tmp_path / "p.de").write_text("".join(s + "\n" for s, _ in pairs))
    (tmp_path / "p.en").write_text("".join(t + "\n" for _, t in pairs))
    c = load_corpus(train_file=str(tmp_path / "p"), source="de", target="en")
    assert c.pairs("train")[1][3] == pairs[3][1]


@pytest.mark.parametrize("content, message", [
    ('{"de": "a", "en": "b"}\n', "line 1 has no 'translation' object"),
    ('{"translation": {"fr": "a", "en": "b"}}\n', "no 'de' key"),
    ("not json\n", "line 1 is not valid JSON"),
    ("", "training split .* is empty"),
    ('{"translation": {"de": "", "en": "b"}}\n', "is empty"),
])
def test_file_errors(tmp_path, content, message):
    f = tmp_path / "bad.jsonl"
    f.write_text(content)
    with pytest.raises(HfAttnInputError, match=message):
        load_corpus(train_file=str(f), source="de" if "fr" in content else None, target="en" if "fr" in content else None)


def test_missing_and_tsv_errors(tmp_path):
    with pytest.raises(HfAttnInputError, match="--train_file '.*nope.jsonl': no such file"):
        load_corpus(train_file=str(tmp_path / "nope.jsonl"))
    (tmp_path / "x.tsv").write_text("a\tb\tc\n")
    with pytest.raises(HfAttnInputError, match="3 columns, need 2"):
        load_corpus(train_file=str(tmp_path / "x.tsv"))


def test_datasets_dataset(tmp_path):
    import datasets

    pairs = bible_pairs(20)
    rows = [{"translation": {"de": s, "en": t}} for s, t in pairs]
    datasets.DatasetDict({"train": datasets.Dataset.from_list(rows[:16]),
                          "validation": datasets.Dataset.from_list(rows[16:18]),
                          "test": datasets.Dataset.from_list(rows[18:])}).save_to_disk(str(tmp_path / "ds"))
    c = load_corpus(dataset=str(tmp_path / "ds"))
    assert c.sizes() == {"train": 16, "validation": 2, "test": 2} and c.source_lang == "de"
    datasets.Dataset.from_list([{"de": s, "en": t} for s, t in pairs]).save_to_disk(str(tmp_path / "flat"))
    with pytest.raises(HfAttnInputError, match="has no 'translation' column \\(columns: \\['de', 'en'\\]\\)"):
        load_corpus(dataset=str(tmp_path / "flat"))
