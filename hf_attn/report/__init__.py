"""The report of `hf-attn reproduce`: the run records judged and written up (``REPORT.md``, ``report.json``, the
plots, the README's headline block and the paper pages' "What we measured" blocks), from the records alone.

- `report`: `write_report`, the whole report;
- `records`: the records of an output directory and the test split each was scored on;
- `seeds`, `columns`, `tables`, `lengths`, `machines`, `plots`: groups across seeds and the seed-aware bootstrap,
  the tables, BLEU by source length, the machine effect, the figures;
- `claims`, `claim_checks`, `evidence`: the papers' claims, their criteria and the figures that back them;
- `experiments`, `converged_report`, `retrofit_report`: the sections of the pre-registered files;
- `readme`, `paper_pages`: the README's and the paper pages' generated blocks.

It reads the definitions of the runs (`hf_attn.plans`) and never imports the runner (`hf_attn.reproduce`) or
training (`hf_attn.training`): `tests/test_import_graph.py` checks it. `hf-attn reproduce --report_only` writes it.
"""
