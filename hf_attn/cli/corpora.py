"""``hf-attn corpora``: list the Bible translations (the --source/--target codes)."""

from __future__ import annotations

from ..data.bible import describe_translations
from .flags import OneLineParser

def run(argv) -> int:
    OneLineParser(prog="hf-attn corpora", description="list the Bible translations (--source/--target codes)").parse_args(argv)
    print(describe_translations())
    return 0
