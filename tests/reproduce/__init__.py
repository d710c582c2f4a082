"""`hf-attn reproduce`: the matrix of runs, seeds and claims, the report."""
