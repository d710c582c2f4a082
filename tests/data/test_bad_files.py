"""Bad data files: non-UTF-8 bytes, a byte-order mark, non-string JSON values and empty sentences give one
clear line or a printed count, never a traceback or silent garbage."""

from __future__ import annotations

import json
import math

import pytest

from hf_attn.data import load_corpus
from hf_attn.errors import HfAttnInputError

LATIN1 = "Straße".encode("latin-1")  # b"Stra\xdfe": not UTF-8


def _pairs(n=6):
    return [(f"Satz {i}", f"sentence {i}") for i in range(n)]


def _jsonl(pairs):
    return "".join(json.dumps({"translation": {"de": s, "en": t}}) + "\n" for s, t in pairs).encode()


@pytest.mark.parametrize("name", ["train.jsonl", "train.tsv", "p"])
def test_non_utf8_bytes_name_the_file_and_line(tmp_path, name):
    good = _pairs()
    if name.endswith(".jsonl"):
        data = _jsonl(good) + b'{"translation": {"de": "' + LATIN1 + b'", "en": "street"}}\n'
    else:
        data = "".join(f"{s}\t{t}\n" for s, t in good).encode() + LATIN1 + b"\tstreet\n"
    if name == "p":
        (tmp_path / "p.de").write_bytes(b"".join(s.encode() + b"\n" for s, _ in good) + LATIN1 + b"\n")
        (tmp_path / "p.en").write_bytes(b"".join(t.encode() + b"\n" for _, t in good) + b"street\n")
    else:
        (tmp_path / name).write_bytes(data)
    with pytest.raises(HfAttnInputError, match=r"line 7 is not UTF-8 \(byte 0xdf at column \d+\); convert the file"):
        load_corpus(train_file=str(tmp_path / name), source="de" if name == "p" else None,
                    target="en" if name == "p" else None)


def test_non_utf8_test_file_in_evaluate(tmp_path):
    from hf_attn.rundir import run_pairs

    (tmp_path / "t.tsv").write_bytes(b"a\tb\n" + LATIN1 + b"\tstreet\n")
    with pytest.raises(HfAttnInputError, match=r"--test_file '.*t.tsv' line 2 is not UTF-8"):
        run_pairs(str(tmp_path), test_file=str(tmp_path / "t.tsv"))


def test_a_bible_runs_test_file_is_read_in_the_runs_language_order(tmp_path):
    """A model trained on the Bible's de -> en: a file keyed en, de is still scored de -> en; a file of other
    languages is one line (it used to be scored silently); keys that name no language keep the file's order."""
    from hf_attn.rundir import run_pairs

    (tmp_path / "run_args.json").write_text(json.dumps({"hf_attn": {"corpus": "bible", "source": "e", "target": "4"}}))
    f = tmp_path / "t.jsonl"
    f.write_text(json.dumps({"translation": {"en": "In the beginning", "de": "Im Anfang"}}) + "\n", encoding="utf-8")
    assert run_pairs(str(tmp_path), test_file=str(f))[:2] == (["Im Anfang"], ["In the beginning"])
    f.write_text(json.dumps({"translation": {"fr": "Au commencement", "es": "En el principio"}}) + "\n")
    with pytest.raises(HfAttnInputError, match=r"has the keys 'fr' and 'es', but the model translates de -> en; "
                                               r"give a file with 'de' and 'en' keys"):
        run_pairs(str(tmp_path), test_file=str(f))
    f.write_text(json.dumps({"translation": {"src": "Im Anfang", "tgt": "In the beginning"}}) + "\n")
    assert run_pairs(str(tmp_path), test_file=str(f))[:2] == (["Im Anfang"], ["In the beginning"])
    tsv = tmp_path / "t.tsv"
    tsv.write_text("en\tde\nIn the beginning\tIm Anfang\n", encoding="utf-8")  # a header naming the languages
    assert run_pairs(str(tmp_path), test_file=str(tsv))[:2] == (["Im Anfang"], ["In the beginning"])


def test_tsv_byte_order_mark_is_not_part_of_the_language(tmp_path):
    f = tmp_path / "train.tsv"
    f.write_text("\ufeffde\ten\n" + "".join(f"{s}\t{t}\n" for s, t in _pairs(30)), encoding="utf-8")
    c = load_corpus(train_file=str(f))
    assert (c.source_lang, c.target_lang) == ("de", "en")
    f.write_text("\ufeff" + "".join(f"{s}\t{t}\n" for s, t in _pairs(30)), encoding="utf-8")  # no header
    assert load_corpus(train_file=str(f)).pairs("train")[0][0] == "Satz 0"


@pytest.mark.parametrize("value", [["a", "b"], 123, True, {"x": 1}])
def test_non_string_json_values_are_an_error(tmp_path, value):
    f = tmp_path / "train.jsonl"
    f.write_text(_jsonl(_pairs()).decode() + json.dumps({"translation": {"de": value, "en": "b"}}) + "\n")
    with pytest.raises(HfAttnInputError, match=r"line 7: 'translation'\['de'\] is a (list|int|bool|dict), not a string"):
        load_corpus(train_file=str(f))


def test_empty_sentences_are_counted(tmp_path, capsys):
    pairs = _pairs(30) + [("", "x"), ("y", "  ")]
    f = tmp_path / "train.jsonl"
    f.write_text(_jsonl(pairs).decode() + json.dumps({"translation": {"de": None, "en": "z"}}) + "\n")
    c = load_corpus(train_file=str(f))
    assert sum(c.sizes().values()) - c.sizes()["test"] == 30
    out = capsys.readouterr().out
    assert "dropped 3 of 33 pairs in --train_file" in out and "empty source or target" in out, out
    (tmp_path / "t.tsv").write_text("".join(f"{s}\t{t}\n" for s, t in pairs))
    load_corpus(train_file=str(tmp_path / "t.tsv"))
    assert "dropped 2 of 32 pairs in --train_file" in capsys.readouterr().out


def test_strict_json_writer(tmp_path):
    from hf_attn.io_utils import write_json

    p = write_json(tmp_path / "r.json", {"loss": math.nan, "curve": [[1, math.inf], [2, 1.5]], "n": 3})
    text = p.read_text()
    assert json.loads(text) == {"loss": None, "curve": [[1, None], [2, 1.5]], "n": 3}
    assert "NaN" not in text and "Infinity" not in text


def test_dataset_empty_rows_counted(tmp_path, capsys):
    import datasets

    rows = [{"translation": {"de": s, "en": t}} for s, t in _pairs(30) + [("", "x")]]
    datasets.DatasetDict({"train": datasets.Dataset.from_list(rows)}).save_to_disk(str(tmp_path / "ds"))
    c = load_corpus(dataset=str(tmp_path / "ds"))
    assert c.sizes()["train"] + c.sizes()["validation"] == 30
    assert "dropped 1 of 31 pairs in --dataset" in capsys.readouterr().out


def test_reproduce_record_with_a_nan_is_strict_json(tmp_path):
    from hf_attn.plans.matrix import RunSpec, record_path
    from hf_attn.reproduce.runner import _write_record

    spec = RunSpec("softmax", "de", "en", 10, 42)
    _write_record(tmp_path, spec, {"name": spec.name, "analysis": {"entropy": math.nan}}, None)
    assert json.loads(record_path(tmp_path, spec).read_text())["analysis"] == {"entropy": None}
