"""Parallel data for hf-attn: the embedded Bible corpus, local files, `datasets` datasets, SentencePiece tokenizers.

The names load on first use (PEP 562): `hf-attn corpora` reads the Bible list without importing datasets and
transformers."""

from ..lazy import lazy_names

_MODULES = {
    ".bible": ("BIBLE_TRANSLATIONS", "DEFAULT_TRANSLATION", "clean_verse", "read_bible_pair", "resolve_translation"),
    ".corpus": ("Corpus", "load_bible_corpus", "load_corpus", "load_file_corpus", "load_hf_corpus",
                "read_parallel_file"),
    ".preprocess": ("make_collator", "tokenize_split"),
    ".tokenizer": ("cache_root", "get_tokenizer", "load_tokenizer", "special_token_config"),
}
_EXPORTS = {name: module for module, names in _MODULES.items() for name in names}


__getattr__, __dir__ = lazy_names(__name__, _EXPORTS, globals())

__all__ = [
    "BIBLE_TRANSLATIONS", "DEFAULT_TRANSLATION", "Corpus", "cache_root", "clean_verse", "get_tokenizer",
    "load_bible_corpus", "load_corpus", "load_file_corpus", "load_hf_corpus", "load_tokenizer", "make_collator",
    "read_bible_pair", "read_parallel_file", "resolve_translation", "special_token_config", "tokenize_split",
]
