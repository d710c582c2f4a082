"""The `hf-attn` commands, and their one-line errors for bad input."""
