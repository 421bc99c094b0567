"""The data of every task: corpora, vocabularies, batching, and the article-title pairs of headline generation.

* :mod:`sohsm.data.corpora`: the known corpora, their files and splits; :mod:`sohsm.data.corpus_files`:
  checking and fetching those files.
* :mod:`sohsm.data.loading`: :func:`load_corpus`, token ids and their cache; :mod:`sohsm.data.split_text`:
  where each split's text is in its files, and its words as rows.
* :mod:`sohsm.data.vocab`: :class:`Vocabulary`, frequency-sorted with counts.
* :mod:`sohsm.data.batching`: :func:`batchify` and truncated-BPTT windows (language models).
* :mod:`sohsm.data.headlines`, :mod:`sohsm.data.pairs`: Gigaword and DUC pairs, padded batches (headlines).
* :mod:`sohsm.data.gigaword`: Rush et al.'s headline pairs made from your own English Gigaword
  (:mod:`sohsm.data.gigaword_sgml` reads its SGML, :mod:`sohsm.data.ptb_tokens` makes PTB-style tokens).
* :mod:`sohsm.data.reverse`: the synthetic reverse task.
* :mod:`sohsm.data.files`: data and cache directories, checksums; :mod:`sohsm.data.downloads`: downloads.

The modules that need torch (batching, loading) are imported on first use of their names, so that listing
and checking corpora (``sohsm data list``) starts at once.
"""
import types

from sohsm.data.corpora import CORPORA, CorpusSpec, FileSpec, Split, corpus_names, get_spec, register_corpus
from sohsm.data.corpus_files import CorpusStatus, FileStatus, corpus_status, fetch, verify_corpus
from sohsm.data.downloads import Source
from sohsm.data.errors import DataError
from sohsm.data.files import resolve_cache_dir, resolve_data_dir
from sohsm.data.vocab import EOS, UNK, VocabConfig, Vocabulary

__all__ = [
    "CORPORA",
    "Corpus",
    "CorpusSpec",
    "CorpusStatus",
    "DataError",
    "EOS",
    "FileSpec",
    "FileStatus",
    "Source",
    "Split",
    "UNK",
    "VocabConfig",
    "Vocabulary",
    "batchify",
    "bptt_batches",
    "corpus_names",
    "corpus_status",
    "fetch",
    "get_spec",
    "load_corpus",
    "num_bptt_batches",
    "register_corpus",
    "resolve_cache_dir",
    "resolve_data_dir",
    "verify_corpus",
]


#: names from the modules that import torch, given on first use
_LAZY = {"batchify": "batching", "bptt_batches": "batching", "num_bptt_batches": "batching",
         "Corpus": "loading", "load_corpus": "loading"}


def __getattr__(name: str):
    """The names of :mod:`sohsm.data.batching` and :mod:`sohsm.data.loading` on first use (they import torch)."""
    module: types.ModuleType
    if _LAZY.get(name) == "batching":
        from sohsm.data import batching as module
    elif _LAZY.get(name) == "loading":
        from sohsm.data import loading as module
    else:
        raise AttributeError(f"module 'sohsm.data' has no attribute {name!r}")
    value = getattr(module, name)
    globals()[name] = value
    return value
