"""Parallel data for hf-attn: the embedded Bible corpus, local files, `datasets` datasets, SentencePiece tokenizers."""

from .bible import BIBLE_TRANSLATIONS, DEFAULT_TRANSLATION, clean_verse, read_bible_pair, resolve_translation
from .corpus import Corpus, load_bible_corpus, load_corpus, load_file_corpus, load_hf_corpus, read_parallel_file
from .preprocess import make_collator, tokenize_split
from .tokenizer import cache_root, get_tokenizer, load_tokenizer, special_token_config

__all__ = [
    "BIBLE_TRANSLATIONS", "DEFAULT_TRANSLATION", "Corpus", "cache_root", "clean_verse", "get_tokenizer",
    "load_bible_corpus", "load_corpus", "load_file_corpus", "load_hf_corpus", "load_tokenizer", "make_collator",
    "read_bible_pair", "read_parallel_file", "resolve_translation", "special_token_config", "tokenize_split",
]
