"""The papers hf-attn implements or compares with: one citation string per paper, read by the variants' presets
(and from there by the model cards and `hf-attn presets --verbose`)."""

CITATIONS = {
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
