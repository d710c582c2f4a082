"""Strict JSON files and UTF-8 text reading with one clear error line (file, line, fix) instead of a traceback."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

from .errors import HfAttnInputError


def finite_or_none(obj):
    """``obj`` with every non-finite float (NaN, inf) replaced by None, recursively: strict JSON has no NaN."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: finite_or_none(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [finite_or_none(v) for v in obj]
    return obj


def dumps_strict(obj, **kwargs) -> str:
    """``json.dumps`` that always writes strict JSON: non-finite numbers become null (``allow_nan=False``)."""
    return json.dumps(finite_or_none(obj), allow_nan=False, **kwargs)


def write_json(path: str | os.PathLike, obj, indent: int | None = 2, **kwargs) -> Path:
    """Write ``obj`` as strict JSON (NaN/inf -> null), all or nothing: a temporary file renamed into place."""
    p = Path(path)
    tmp = p.with_name(p.name + ".tmp")
    tmp.write_text(dumps_strict(obj, indent=indent, **kwargs), encoding="utf-8")
    tmp.replace(p)
    return p


def decode_utf8(data: bytes, what: str) -> str:
    """``data`` decoded as UTF-8 (a leading byte-order mark dropped), or one error naming ``what``, the line and the
    fix."""
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        col = e.start - (data.rfind(b"\n", 0, e.start) + 1) + 1
        raise HfAttnInputError(
            f"{what} line {line} is not UTF-8 (byte 0x{data[e.start]:02x} at column {col}); convert the file to "
            "UTF-8, e.g. `iconv -f latin1 -t utf-8 FILE > FILE.utf8`"
        ) from None


def read_text(path: str | os.PathLike, what: str) -> str:
    """The text of a UTF-8 file (BOM dropped); ``what`` names it in errors, e.g. ``"--train_file 'x.tsv'"``."""
    try:
        data = Path(path).read_bytes()
    except OSError as e:
        raise HfAttnInputError(f"{what}: cannot read it ({e.strerror or e}); give a readable file") from None
    return decode_utf8(data, what)


def text_lines(text: str) -> list[str]:
    """The lines of ``text`` split on newlines only (not on U+2028 and the like, which JSON strings may hold)."""
    lines = text.replace("\r\n", "\n").split("\n")
    return lines[:-1] if lines and lines[-1] == "" else lines


def check_output_file(path: str | os.PathLike, flag: str) -> Path:
    """Fail now, before any work, when ``path`` cannot be written (a directory, a missing or read-only folder)."""
    p = Path(path)
    if p.is_dir():
        raise HfAttnInputError(f"{flag} {str(path)!r} is a directory; give a file name")
    existed = p.exists()
    try:
        with open(p, "a", encoding="utf-8"):
            pass
    except OSError as e:
        raise HfAttnInputError(f"{flag} {str(path)!r} cannot be written ({e.strerror or e}); give a file in a "
                               "directory you can write to") from None
    if not existed:
        p.unlink()
    return p


def ensure_writable_dir(path: str | os.PathLike, flag: str = "--output_dir") -> Path:
    p = Path(path)
    try:
        p.mkdir(parents=True, exist_ok=True)
        probe = p / f".hf_attn_write_test.{os.getpid()}"  # processes of one accelerate run probe at once
        probe.write_text("ok")
        probe.unlink()
    except OSError as e:
        why = "it is a file" if p.is_file() else e.strerror or e
        raise HfAttnInputError(
            f"{flag} {str(path)!r} is not a writable directory ({why}); choose a directory you can write to"
        ) from None
    return p


def check_creatable_dir(path: str | os.PathLike, label: str) -> None:
    """Fail before any work when the directory ``path`` could not be made: its nearest existing ancestor is a file or
    cannot be written. Nothing is made (``label`` names it in the one line, e.g. ``"output directory"``)."""
    p = Path(path).absolute()
    parent = next(a for a in (p, *p.parents) if a.exists())
    why = f"{str(parent)!r} is a file" if not parent.is_dir() else \
        None if os.access(parent, os.W_OK | os.X_OK) else f"{str(parent)!r} is not writable"
    if why:
        raise HfAttnInputError(f"{label} {str(path)!r} cannot be written to ({why}); choose a directory you can write to")


def with_marked_block(text: str, start: str, end: str, body: str) -> str | None:
    """``text`` with what lies between the markers ``start`` and ``end`` replaced by ``body`` on lines of its own
    (markers kept, everything else untouched); None when ``text`` lacks either marker."""
    if start not in text or end not in text.split(start, 1)[1]:
        return None
    head, rest = text.split(start, 1)
    _, tail = rest.split(end, 1)
    return head + start + "\n" + body + "\n" + end + tail


def check_marked_file(path: str | os.PathLike, start: str, end: str, what: str) -> None:
    """One line when the file ``path`` (``what`` names it, e.g. ``"--readme"``) cannot be read or lacks the marker
    lines ``start`` and ``end``: checked before the work whose result `replace_marked_block` writes there."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise HfAttnInputError(f"{what} {str(path)!r} cannot be read ({getattr(e, 'strerror', None) or e}); give an "
                               "existing UTF-8 file") from None
    if with_marked_block(text, start, end, "") is None:
        raise HfAttnInputError(f"{what} {str(path)!r} has no block between {start} and {end}; add the two marker "
                               "lines where the generated text belongs")


def replace_marked_block(path: str | os.PathLike, start: str, end: str, body: str) -> bool:
    """Replace the text between the marker lines ``start`` and ``end`` of the file ``path`` with ``body`` (markers
    kept, everything else untouched); False, and nothing written, when the file lacks either marker."""
    p = Path(path)
    text = with_marked_block(p.read_text(encoding="utf-8"), start, end, body)
    if text is None:
        return False
    p.write_text(text, encoding="utf-8")
    return True
