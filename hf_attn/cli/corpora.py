"""``hf-attn corpora``: list the Bible translations (the --source/--target codes)."""

from __future__ import annotations

import argparse

from ..data.bible import describe_translations

def run(argv) -> int:
    argparse.ArgumentParser(prog="hf-attn corpora", description="list the Bible translations (--source/--target codes)").parse_args(argv)
    print(describe_translations())
    return 0
