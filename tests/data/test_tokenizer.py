"""Tokenizers (hf_attn/data/tokenizer.py): trained on the data, cached and reloaded for Marian and BART; a corrupt or
truncated tokenizer is trained again in the cache and is one error line in a run directory."""

from __future__ import annotations

import shutil

import pytest

from hf_attn.data import get_tokenizer, load_tokenizer
from hf_attn.data import tokenizer as tokmod
from hf_attn.errors import HfAttnInputError
from training_helpers import bible_pairs, cli_in_process


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


def _texts():
    pairs = bible_pairs(200)
    return [s for s, _ in pairs] + [t for _, t in pairs]


@pytest.mark.parametrize("damage", ["truncate", "garbage", "empty"])
def test_a_corrupt_cached_tokenizer_is_trained_again(tmp_path, damage, capsys):
    tok, path = get_tokenizer(_texts(), vocab_size=300, cache_dir=tmp_path)
    want = tok("Im Anfang war das Wort.").input_ids
    spm = path / "source.spm"
    data = spm.read_bytes()
    spm.write_bytes({"truncate": data[: len(data) // 3], "garbage": b"\x00not a model\xff" * 50, "empty": b""}[damage])
    with pytest.raises(HfAttnInputError, match=r"the tokenizer in .* cannot be read .*restore them"):
        load_tokenizer(path)
    again, path2 = get_tokenizer(_texts(), vocab_size=300, cache_dir=tmp_path)
    assert path2 == path and again("Im Anfang war das Wort.").input_ids == want
    assert "cannot be read; training it again" in capsys.readouterr().out
    assert [p.name for p in tmp_path.iterdir()] == [path.name]  # nothing left aside


@pytest.mark.slow
def test_a_corrupt_run_directory_tokenizer_is_one_line(trained, tmp_path, capsys):
    run = tmp_path / "run"  # a copy of the session's run, damaged
    shutil.copytree(trained, run, ignore=shutil.ignore_patterns("checkpoint-*"))
    (run / "target.spm").write_bytes(b"\x08\x01garbage")
    src = tmp_path / "in.txt"
    src.write_text("Im Anfang war das Wort.\n")
    code, err = cli_in_process(["translate", str(run), "--input", str(src)], capsys)
    errors = [line for line in err.splitlines() if line.startswith("hf-attn:")]
    assert code == 2 and len(errors) == 1
    assert f"the tokenizer in {str(run)!r} cannot be read" in errors[0]
