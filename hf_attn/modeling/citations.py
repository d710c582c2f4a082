"""The papers hf-attn implements or compares with: one citation string per paper, the one place each is typed.

Read by the variants' presets (and from there by the model cards and `hf-attn presets --verbose`), and by the
documentation: the citations in README.md's variants table, docs/index.md's papers table and the first lines of each
docs/papers/<key>.md page are written from here by `python scripts/write_citations.py` (tests/test_docs.py fails
until they are). Each entry reads "Authors Year, Title (Venue)", authors as "A", "A & B", "A, B & C" or "A et al."
"""

CITATIONS = {
    "transformer": "Vaswani et al. 2017, Attention Is All You Need (NeurIPS)",
    "sparsemax": ("Martins & Astudillo 2016, From Softmax to Sparsemax: A Sparse Model of Attention and Multi-Label "
                  "Classification (ICML)"),
    "entmax": "Peters, Niculae & Martins 2019, Sparse Sequence-to-Sequence Models (ACL)",
    "rela": "Zhang, Titov & Sennrich 2021, Sparse Attention with Linear Units (EMNLP)",
    "gmm": ("Zhang & Feng 2021, Modeling Concentrated Cross-Attention for Neural Machine Translation with Gaussian "
            "Mixture Model (Findings of EMNLP)"),
    "reluformer": ("Shen, Guo, Tan, Tang, Wang & Bian 2023, A Study on ReLU and Softmax in Transformer "
                   "(arXiv:2302.06461)"),
    "calibration": ("Lu, Zeng, Zhang, Wu & Li 2021, Attention Calibration for Transformer in Neural Machine "
                    "Translation (ACL)"),
    "ran": "Zeng et al. 2021, Recurrent Attention for Neural Machine Translation (EMNLP)",
    "hard-coded-gaussian": ("You, Sun & Iyyer 2020, Hard-Coded Gaussian Attention for Neural Machine Translation "
                            "(ACL)"),
    "synthesizer": "Tay et al. 2021, Synthesizer: Rethinking Self-Attention in Transformer Models (ICML)",
}
