"""``hf-attn reproduce``: train a matrix of runs with one recipe, one process per run (`runner`), the converged
matrix in slots of machine time (`slot`), and what a record adds beside the scores (`run_extras`).

The runs are defined in `hf_attn.plans`; the report that judges their records is `hf_attn.report`, which never
imports this package.
"""
