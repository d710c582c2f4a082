"""The embedded Bible corpus (hf_attn/data/bible.py): the split by book, the verse cleanup, the translation codes, and
reading only the two translations asked for."""

from __future__ import annotations

import json

import pytest

from hf_attn.data import BIBLE_TRANSLATIONS, clean_verse, read_bible_pair, resolve_translation
from hf_attn.errors import HfAttnInputError


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


def test_bible_reading_is_fast():
    import time

    t = time.perf_counter()
    read_bible_pair("s", "k")
    assert time.perf_counter() - t < 10  # two translations only, not the whole 218 MB
    assert json.dumps(read_bible_pair("l", "e")["test"][0], ensure_ascii=False).count("fr") == 1
