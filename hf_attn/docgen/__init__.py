"""The documentation's generated blocks that come from the code's declarations, not from runs: the citations
(`citation_docs`, `citation_cff`: the variants tables, the paper pages' citation and BibTeX blocks,
``CITATION.cff``), the configuration and hyperparameter tables of docs/api.md (`api_tables`), the paper pages
themselves (`pages`: which page documents which variants) and the rewrite the scripts share (`rewrite`).

``python scripts/write_citations.py`` and ``python scripts/write_api_tables.py`` run them; the tests fail while a
committed block differs. It builds on `hf_attn.modeling` only (and `errors`, `io_utils`, `version`).
"""
