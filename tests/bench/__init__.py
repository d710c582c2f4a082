"""hf_attn.bench and the speed scripts: the benchmark, memory, torch.compile."""
