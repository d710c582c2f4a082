"""``hf-attn reproduce``: a matrix of training runs with one recipe, and the report that compares them."""
