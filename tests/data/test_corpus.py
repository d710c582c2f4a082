"""Data: the Bible corpus, local files, `datasets` datasets, tokenizers (cached), length filtering, padding."""

from __future__ import annotations

import json

import pytest
import torch

from hf_attn.data import (
    BIBLE_TRANSLATIONS,
    clean_verse,
    get_tokenizer,
    load_corpus,
    load_tokenizer,
    make_collator,
    read_bible_pair,
    resolve_translation,
    tokenize_split,
)
from hf_attn.data import tokenizer as tokmod
from hf_attn.errors import HfAttnInputError
from training_helpers import bible_pairs, write_jsonl


@pytest.fixture(scope="module")
def bible():
    return read_bible_pair("de", "en")


def test_bible_split_by_book(bible):
    assert len(bible["test"]) == 879 and len(bible["validation"]) == 1007
    assert len(bible["train"]) == 31102 - 879 - 1007  # no verse is empty in Elberfelder/WEB
    assert {r["id"].split(".")[0] for r in bible["test"]} == {"43"}
    assert {r["id"].split(".")[0] for r in bible["validation"]} == {"44"}
    assert not {r["id"].split(".")[0] for r in bible["train"]} & {"43", "44"}
    first = bible["test"][0]["translation"]
    assert first == {"de": "Im Anfang war das Wort, und das Wort war bei Gott, und das Wort war Gott.",
                     "en": "In the beginning was the Word, and the Word was with God, and the Word was God."}


def test_bible_cleanup(bible):
    text = " ".join(r["translation"]["en"] + r["translation"]["de"] for split in bible.values() for r in split)
    for mark in "[]`*#\t\n":
        assert mark not in text, mark
    assert clean_verse("As an offering of first -[fruits] you\tshall [even] God`s  ") == \
        "As an offering of first-fruits you shall even God's"


def test_translation_codes():
    assert len(BIBLE_TRANSLATIONS) == 31
    assert resolve_translation("de").code == "e" and resolve_translation("en").code == "4"
    assert resolve_translation("s").name == "Schlachter 1951" and resolve_translation("KJV1611").code == "k"
    with pytest.raises(HfAttnInputError, match="unknown Bible language or translation code 'xx'.*valid language codes"):
        resolve_translation("xx")
    with pytest.raises(HfAttnInputError, match="same Bible translation"):
        read_bible_pair("en", "4")


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


@pytest.mark.parametrize("base", ["marian", "bart"])
def test_tokenizer_trained_cached_and_reloaded(tmp_path, monkeypatch, base):
    pairs = bible_pairs(150)
    texts = [s for s, _ in pairs] + [t for _, t in pairs]
    tok, path = get_tokenizer(texts, base=base, vocab_size=300, cache_dir=tmp_path)
    assert 250 <= len(tok) <= 310
    if base == "marian":
        assert (tok.eos_token_id, tok.unk_token_id, tok.pad_token_id) == (0, 1, len(tok) - 1)
    else:
        assert (tok.bos_token_id, tok.pad_token_id, tok.eos_token_id, tok.unk_token_id) == (0, 1, 2, 3)
    enc = tok([pairs[0][0]], text_target=[pairs[0][1]])
    assert enc["input_ids"][0][-1] == tok.eos_token_id and enc["labels"][0][-1] == tok.eos_token_id
    assert tok.decode(enc["labels"][0], skip_special_tokens=True) == pairs[0][1]
    assert tok.unk_token_id not in enc["input_ids"][0]

    def boom(*a, **k):
        raise AssertionError("the cached tokenizer was retrained")

    monkeypatch.setattr(tokmod, "train_sentencepiece", boom)
    tok2, path2 = get_tokenizer(texts, base=base, vocab_size=300, cache_dir=tmp_path)
    assert path2 == path and tok2(pairs[1][0])["input_ids"] == tok(pairs[1][0])["input_ids"]
    with pytest.raises(AssertionError, match="retrained"):  # other data -> other cache entry
        get_tokenizer(texts[:-1], base=base, vocab_size=300, cache_dir=tmp_path)
    # the saved files load with AutoTokenizer alone
    assert load_tokenizer(path)(pairs[2][0])["input_ids"] == tok(pairs[2][0])["input_ids"]


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


def test_bible_reading_is_fast():
    import time

    t = time.perf_counter()
    read_bible_pair("s", "k")
    assert time.perf_counter() - t < 10  # two translations only, not the whole 218 MB
    assert json.dumps(read_bible_pair("l", "e")["test"][0], ensure_ascii=False).count("fr") == 1
