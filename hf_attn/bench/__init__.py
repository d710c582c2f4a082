"""Speed, memory and torch.compile checks of hf-attn models against stock transformers, shared by
``scripts/benchmark.py`` and ``scripts/check_compile.py`` (which only parse their flags).

- `models`: the hf-attn and the stock models of one size, and random batches with padded rows;
- `timing`: the timed calls, interleaved rounds and speed ratios;
- `memory`: peak memory of a call, and this process's memory (used by training too);
- `profile`: FLOP bounds and torch.profiler tables;
- `op_count`: the aten operators (kernel launches) of a training step under autocast, per preset against stock;
- `results`: the benchmark result file, typed (`load_result`; the report and the paper claims read it);
- `runner`: the benchmark's sentence-level and long-sequence modes;
- `compile_check`: eager against compiled, per preset;
- `render`: Markdown tables, the plot and the generated blocks of the docs' Speed page;
- `gpu`, `gpu_render`: the GPU suite (``--gpu-suite``) and the Speed page's "On a GPU" blocks.

It builds on `hf_attn.modeling` (and `hf_attn.io_utils`) only; training, the report and the CLI import it, never the
other way round.
"""
