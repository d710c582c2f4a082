"""hf_attn.data: the Bible corpus, data files and `datasets` datasets, tokenizers, preprocessing."""
