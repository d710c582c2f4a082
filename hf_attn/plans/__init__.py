"""What `hf-attn reproduce` runs, defined once for the runner that trains it and the report that judges it: no
training and no processes here (the presets are checked against `hf_attn.modeling`).

- `matrix`: `RunSpec` (one run: preset, pair, budget, seed, base, extra `hf-attn train` flags, a retrofit child's
  parent), the runs of a command line (`matrix`) or of an experiments file (`experiment_specs`), where a run's record
  and translations live (`record_path`);
- `converged`: the converged-matrix file (``results/converged.json``) and its pre-registered budget rule;
- `retrofit`: the retrofit file (``results/retrofit.json``): its parents and children, and when a child may start;
- `rules`: the rule types of the pre-registered files (`RULES`).

The runner (`hf_attn.reproduce`) and the report (`hf_attn.report`) import these; they import neither.
"""
