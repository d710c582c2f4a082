"""The papers hf-attn implements or compares with, and hf-attn itself: one structured `Citation` per work, the one
place each is typed.

Everything that cites a paper is generated from `CITATIONS`: the variants' presets (``Preset.paper`` is
``str(CITATIONS[key])``, "Authors Year, Title (Venue)"), and from them the model cards' Citation block (BibTeX) and
`hf-attn presets --verbose`; the README's and docs/index.md's variants tables, each docs/papers/<key>.md page's
citation and BibTeX blocks and the repository's CITATION.cff are written by ``python scripts/write_citations.py``
(tests/test_citations.py fails until they are). `HF_ATTN` is hf-attn's own entry (CITATION.cff, the model cards).

Each entry holds the paper's authors ("Family, Given", in the paper's order), year, title and venue as published,
the page of its publication (ACL Anthology, PMLR or arXiv) and the fields of its BibTeX entry; the key is the
Anthology's or PMLR's own where the paper has one.
"""

from __future__ import annotations

from dataclasses import dataclass

# BibTeX spellings of the non-ASCII letters in the authors' names (classic BibTeX reads ASCII only)
_LATEX = {"é": "{\\'e}", "á": "{\\'a}", "ó": "{\\'o}", "Ł": "{\\L}", "ł": "{\\l}", "ü": '{\\"u}', "ö": '{\\"o}'}
# the BibTeX fields of an entry, in the order they are written
_FIELDS = ("booktitle", "series", "volume", "pages", "address", "publisher", "url", "doi", "eprint")


@dataclass(frozen=True)
class Citation:
    """One published work. ``str(citation)`` is the one-line form the presets and the model cards carry:
    "Authors Year, Title (Venue)", authors as "A", "A & B", "A, B & C" or, from four authors on, "A et al."."""

    key: str  # the BibTeX key
    kind: str  # the BibTeX entry type: inproceedings, misc
    authors: tuple  # "Family, Given" each, in the paper's order; one name without a comma = an organisation
    year: int
    title: str
    venue: str  # short: "EMNLP", "Findings of EMNLP", "ACL", "ICML", "NeurIPS", "arXiv"
    url: str = ""  # the publication's page: ACL Anthology, PMLR or arXiv
    booktitle: str = ""
    series: str = ""
    volume: str = ""
    pages: str = ""  # "6507--6520"
    address: str = ""
    publisher: str = ""
    doi: str = ""
    eprint: str = ""  # the arXiv identifier
    version: str = ""  # software only

    @property
    def surnames(self) -> list[str]:
        return [a.split(",")[0].strip() for a in self.authors]

    @property
    def author_text(self) -> str:
        """"A", "A & B", "A, B & C", or "A et al." from four authors on."""
        names = self.surnames
        if len(names) > 3:
            return f"{names[0]} et al."
        return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} & {names[-1]}"

    @property
    def short_authors(self) -> str:
        """"A", "A & B", or "A et al." from three authors on: the form of a table cell."""
        names = self.surnames
        return f"{names[0]} et al." if len(names) > 2 else " & ".join(names)

    @property
    def short(self) -> str:
        """"A et al. Year, Title": the form of a table cell."""
        return f"{self.short_authors} {self.year}, {self.title}"

    def __str__(self) -> str:
        return f"{self.author_text} {self.year}, {self.title} ({self.venue})"

    @property
    def bibtex(self) -> str:
        """The BibTeX entry (title in braces so that styles keep its capitals; names in ASCII LaTeX)."""
        authors = " and ".join(a if "," in a else "{" + a + "}" for a in self.authors)
        fields = [("title", "{" + self.title + "}"), ("author", _latex(authors)), ("year", str(self.year))]
        fields += [(f, _latex(getattr(self, f))) for f in _FIELDS if getattr(self, f)]
        if self.eprint:
            fields.append(("archiveprefix", "arXiv"))
        if self.version:
            fields.append(("note", f"Version {self.version}"))
        body = ",\n".join(f"  {name} = {{{value}}}" for name, value in fields)
        return f"@{self.kind}{{{self.key},\n{body}\n}}"


def _latex(text: str) -> str:
    return "".join(_LATEX.get(ch, ch) for ch in text)


# hf-attn itself, as software (CITATION.cff at the repository root is written from it; the version is the package's)
HF_ATTN = Citation(
    "hf-attn", "misc", ("The hf-attn contributors",), 2026,
    "hf-attn: published NMT attention mechanisms for Hugging Face Transformers' Marian and BART models", "software",
    url="https://github.com/hf-attn/hf-attn")


def cited(text: str) -> list[Citation]:
    """The `CITATIONS` entries whose one-line form ``text`` contains (a preset's ``paper``), in the order cited."""
    found = [(text.find(str(c)), c) for c in CITATIONS.values() if str(c) in text]
    return [c for _, c in sorted(found, key=lambda x: x[0])]


# the papers, by key (a paper's page is docs/papers/<key>.md); this table ends the file
_ACL = "Association for Computational Linguistics"
_EMNLP_2021 = "Proceedings of the 2021 Conference on Empirical Methods in Natural Language Processing"
_PMLR = "Proceedings of Machine Learning Research"

CITATIONS = {
    "transformer": Citation(
        "vaswani2017attention", "inproceedings",
        ("Vaswani, Ashish", "Shazeer, Noam", "Parmar, Niki", "Uszkoreit, Jakob", "Jones, Llion", "Gomez, Aidan N.",
         "Kaiser, Łukasz", "Polosukhin, Illia"),
        2017, "Attention Is All You Need", "NeurIPS", url="https://arxiv.org/abs/1706.03762",
        booktitle="Advances in Neural Information Processing Systems 30", pages="5998--6008", eprint="1706.03762"),
    "sparsemax": Citation(
        "martins2016softmax", "inproceedings", ("Martins, André F. T.", "Astudillo, Ramón F."),
        2016, "From Softmax to Sparsemax: A Sparse Model of Attention and Multi-Label Classification", "ICML",
        url="https://arxiv.org/abs/1602.02068",
        booktitle="Proceedings of the 33rd International Conference on Machine Learning", series=_PMLR, volume="48",
        pages="1614--1623", address="New York, New York, USA", publisher="PMLR", eprint="1602.02068"),
    "entmax": Citation(
        "peters-etal-2019-sparse", "inproceedings", ("Peters, Ben", "Niculae, Vlad", "Martins, André F. T."),
        2019, "Sparse Sequence-to-Sequence Models", "ACL", url="https://aclanthology.org/P19-1146",
        booktitle="Proceedings of the 57th Annual Meeting of the Association for Computational Linguistics",
        pages="1504--1519", address="Florence, Italy", publisher=_ACL, doi="10.18653/v1/P19-1146"),
    "rela": Citation(
        "zhang-etal-2021-sparse", "inproceedings", ("Zhang, Biao", "Titov, Ivan", "Sennrich, Rico"),
        2021, "Sparse Attention with Linear Units", "EMNLP", url="https://aclanthology.org/2021.emnlp-main.523",
        booktitle=_EMNLP_2021, pages="6507--6520", address="Online and Punta Cana, Dominican Republic",
        publisher=_ACL, doi="10.18653/v1/2021.emnlp-main.523", eprint="2104.07012"),
    "gmm": Citation(
        "zhang-feng-2021-modeling-concentrated", "inproceedings", ("Zhang, Shaolei", "Feng, Yang"),
        2021, "Modeling Concentrated Cross-Attention for Neural Machine Translation with Gaussian Mixture Model",
        "Findings of EMNLP", url="https://aclanthology.org/2021.findings-emnlp.121",
        booktitle="Findings of the Association for Computational Linguistics: EMNLP 2021", pages="1401--1411",
        address="Punta Cana, Dominican Republic", publisher=_ACL, doi="10.18653/v1/2021.findings-emnlp.121",
        eprint="2109.05244"),
    "reluformer": Citation(
        "shen2023study", "misc",
        ("Shen, Kai", "Guo, Junliang", "Tan, Xu", "Tang, Siliang", "Wang, Rui", "Bian, Jiang"),
        2023, "A Study on ReLU and Softmax in Transformer", "arXiv", url="https://arxiv.org/abs/2302.06461",
        eprint="2302.06461"),
    "calibration": Citation(
        "lu-etal-2021-attention", "inproceedings",
        ("Lu, Yu", "Zeng, Jiali", "Zhang, Jiajun", "Wu, Shuangzhi", "Li, Mu"),
        2021, "Attention Calibration for Transformer in Neural Machine Translation", "ACL",
        url="https://aclanthology.org/2021.acl-long.103",
        booktitle=("Proceedings of the 59th Annual Meeting of the Association for Computational Linguistics and the "
                   "11th International Joint Conference on Natural Language Processing (Volume 1: Long Papers)"),
        pages="1288--1298", address="Online", publisher=_ACL, doi="10.18653/v1/2021.acl-long.103"),
    "ran": Citation(
        "zeng-etal-2021-recurrent", "inproceedings",
        ("Zeng, Jiali", "Wu, Shuangzhi", "Yin, Yongjing", "Jiang, Yufan", "Li, Mu"),
        2021, "Recurrent Attention for Neural Machine Translation", "EMNLP",
        url="https://aclanthology.org/2021.emnlp-main.258", booktitle=_EMNLP_2021, pages="3216--3225",
        address="Online and Punta Cana, Dominican Republic", publisher=_ACL, doi="10.18653/v1/2021.emnlp-main.258"),
    "hard-coded-gaussian": Citation(
        "you-etal-2020-hard", "inproceedings", ("You, Weiqiu", "Sun, Simeng", "Iyyer, Mohit"),
        2020, "Hard-Coded Gaussian Attention for Neural Machine Translation", "ACL",
        url="https://aclanthology.org/2020.acl-main.687",
        booktitle="Proceedings of the 58th Annual Meeting of the Association for Computational Linguistics",
        pages="7689--7700", address="Online", publisher=_ACL, doi="10.18653/v1/2020.acl-main.687",
        eprint="2005.00742"),
    "synthesizer": Citation(
        "pmlr-v139-tay21a", "inproceedings",
        ("Tay, Yi", "Bahri, Dara", "Metzler, Donald", "Juan, Da-Cheng", "Zhao, Zhe", "Zheng, Che"),
        2021, "Synthesizer: Rethinking Self-Attention for Transformer Models", "ICML",
        url="https://proceedings.mlr.press/v139/tay21a.html",
        booktitle="Proceedings of the 38th International Conference on Machine Learning", series=_PMLR,
        volume="139", pages="10183--10192", publisher="PMLR", eprint="2005.00743"),
}
