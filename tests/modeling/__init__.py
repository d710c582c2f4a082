"""The attention variants and the model classes around them, one file per unit of hf_attn/modeling/."""
