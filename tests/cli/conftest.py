"""The modules that bind `hf_attn.data.load_corpus` and `hf_attn.generation.translate_texts` at import, imported before
any test runs: test_bad_input.py's `no_work` fixture replaces those two functions where they are defined, and a module
first imported under it would keep the replacement for the rest of the session (every later in-process `hf-attn
translate` or training run would fail), whichever order the files run in."""

import hf_attn.cli.translate  # noqa: F401
import hf_attn.training.run  # noqa: F401
