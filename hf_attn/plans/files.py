"""Reading a pre-registered plan file (``results/converged.json``, ``results/retrofit.json``): one error line for
the first thing wrong in it, naming the flag that gave it."""

from __future__ import annotations

import json
from pathlib import Path

from ..errors import HfAttnInputError


def read_plan(path: str | Path, flag: str) -> dict:
    """The JSON of the plan file at ``path`` (given as ``flag``), or one error line."""
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise HfAttnInputError(f"{flag} {str(path)!r}: cannot read it as JSON ({e})") from None


def checker(flag: str, path):
    """``need(ok, what)``: one `HfAttnInputError` line ``<flag> '<path>': <what>`` when ``ok`` is false."""
    def need(ok, what):
        if not ok:
            raise HfAttnInputError(f"{flag} {str(path)!r}: {what}")

    return need


def check_common(cfg, need, keys: tuple) -> None:
    """What every plan file has: its ``keys``, a SOURCE-TARGET ``pair`` and a list of integer ``seeds``."""
    need(isinstance(cfg, dict) and all(k in cfg for k in keys), f"needs the keys {', '.join(keys)}")
    need(isinstance(cfg["pair"], str) and cfg["pair"].count("-") == 1, '"pair" must be SOURCE-TARGET, e.g. de-en')
    need(isinstance(cfg["seeds"], list) and cfg["seeds"] and all(type(s) is int for s in cfg["seeds"]),
         '"seeds" must be a list of integer seeds')
