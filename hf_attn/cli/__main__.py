"""``python -m hf_attn.cli``: the `hf-attn` command."""

import sys

from . import main

sys.exit(main())
