"""hf_attn.analysis: attention statistics, the papers' figures, the attention viewer."""
