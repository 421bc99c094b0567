"""What the two-level heads know of the runs they train in: a new run's defaults, earlier releases' runs.

The registry holds these as the heads' hooks (:func:`sohsm.heads.register_head`), so that a task asks
:func:`~sohsm.heads.setting_defaults`, :func:`~sohsm.heads.legacy_options`, :func:`~sohsm.heads.resume_refusal`
and :func:`~sohsm.heads.update_every_for` of a head's name and never decides by that name itself.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sohsm.heads.registry import HeadDefaults, HeadSetting

#: a new run's tied self-organized head of an LSTM over at least this many words scores rarer words in fewer
#: dimensions (``div_value``, :func:`banded_defaults`)
BANDED_FROM_WORDS = 20_000
#: the ``div_value`` it takes there: bands of d, d/4 and d/16 dimensions
BANDED_DIV_VALUE = 4
#: options that decide a two-level head's word widths themselves: given any, the vocabulary adds none
WIDTH_OPTIONS = ("div_value", "cutoffs", "word_dim", "projection")


def banded_defaults(name: str, options: Mapping[str, Any], setting: HeadSetting) -> HeadDefaults:
    """``div_value=4`` for the tied self-organized head of an LSTM over 20,000 words or more
    (:data:`BANDED_FROM_WORDS`): a rarer word is scored in fewer dimensions and read back up to ``d`` through its
    band's projection, as adaptive input does.

    Measured (``docs/results/fair.md``, LSTM 256, six epochs): WikiText-2 (33k words) 2.0% lower test perplexity,
    below on each of three seeds (p 0.010); the text8 prefix (50k) 3.7% lower dev perplexity (one seed); PTB (10k)
    3.3% higher (three seeds), so a small vocabulary keeps every word at ``d``. Over subword tokens, in a
    transformer or untied it was not measured to help, and is not taken; nor below a hidden size of 16, where the
    rarest band would have no dimension. Any option of a word's width given (``div_value=null`` included) is kept
    as given.
    """
    if (setting.model != "lstm" or not setting.tied or setting.subwords or setting.n_words < BANDED_FROM_WORDS
            or setting.hidden_size < BANDED_DIV_VALUE ** 2  # its rarest band would have no dimension
            or any(key in options for key in WIDTH_OPTIONS)):
        return HeadDefaults({})
    return HeadDefaults({"div_value": BANDED_DIV_VALUE},
                        f"the default for a tied LSTM's {name} head over {BANDED_FROM_WORDS:,} words or more (rarer "
                        "words in fewer dimensions; --head-option div_value=null keeps every word at the hidden size)")


#: a new run's self-organized head on the CPU keeps ``q`` compact where the dense ``q`` would hold more bytes than this
COMPACT_Q_FROM_BYTES = 256 * 2**20
#: the ``q_clusters`` it takes there (each word's 16 best clusters: no loss on PTB, docs/results/lm.md)
COMPACT_Q_CLUSTERS = 16


def compact_q_defaults(name: str, options: Mapping[str, Any], setting: HeadSetting) -> HeadDefaults:
    """``q_clusters=16`` for a self-organized head trained on the CPU whose dense statistics ``q`` (``N x`` learned
    clusters, float32) would hold more than 256 MiB (:data:`COMPACT_Q_FROM_BYTES`: from about 190,000 words): each
    word keeps its 16 best clusters, ``N x 33 x 4`` bytes (126 MiB at a million words in place of 3.7 GiB).

    Measured (``docs/results/lm.md``, "q in a compact form", PTB, three seeds): dev perplexity within 0.1% of the
    dense ``q``'s. Not taken on a GPU, whose sync-free path folds the dense ``q`` only, nor where ``q_clusters`` or
    ``stay_margin`` (which needs the dense ``q``) is given.
    """
    from sohsm.clustering import default_n_clusters  # the clustering package imports torch

    if setting.device != "cpu" or "q_clusters" in options or options.get("stay_margin"):
        return HeadDefaults({})
    learned = options.get("n_clusters") or default_n_clusters(setting.n_words)
    dense = setting.n_words * learned * 4
    if dense <= COMPACT_Q_FROM_BYTES:
        return HeadDefaults({})
    compact = setting.n_words * (2 * COMPACT_Q_CLUSTERS + 1) * 4
    return HeadDefaults({"q_clusters": COMPACT_Q_CLUSTERS},
                        f"the default on the CPU where the dense statistics q would hold more than "
                        f"{COMPACT_Q_FROM_BYTES // 2**20} MiB (each word's {COMPACT_Q_CLUSTERS} best clusters: "
                        f"{compact / 2**20:,.0f} MiB in place of {dense / 2**20:,.0f} MiB; --head-option "
                        "q_clusters=null keeps q dense)")


def unseen_apart_defaults(name: str, options: Mapping[str, Any], setting: HeadSetting) -> HeadDefaults:
    """``unseen_words="apart"`` for a self-organized head whose vocabulary holds words the training split never shows
    (a tokenizer's rows the corpus does not use): they take clusters of their own. Measured over Llama 3's and
    o200k's vocabularies on WikiText-2 (``docs/results/large-vocab.md``). A word vocabulary built from the
    training split has no such word: nothing changes there."""
    if not setting.unseen_words or "unseen_words" in options:
        return HeadDefaults({})
    return HeadDefaults({"unseen_words": "apart"},
                        f"the default where the vocabulary holds words training never shows ({setting.unseen_words:,} "
                        f"of {setting.n_words:,} here): they take clusters of their own (--head-option "
                        "unseen_words=spread places them as any other word)")


def self_organized_defaults(name: str, options: Mapping[str, Any], setting: HeadSetting) -> HeadDefaults:
    """The self-organized head's defaults of a new run: :func:`banded_defaults`, :func:`compact_q_defaults` and
    :func:`unseen_apart_defaults`."""
    parts = [banded_defaults(name, options, setting), compact_q_defaults(name, options, setting),
             unseen_apart_defaults(name, options, setting)]
    parts = [part for part in parts if part.options]
    if len(parts) < 2:
        return parts[0] if parts else HeadDefaults({})
    reasons = "; ".join(", ".join(f"{key}={value}" for key, value in part.options.items()) + f": {part.reason}"
                        for part in parts)
    return HeadDefaults({key: value for part in parts for key, value in part.options.items()}, reasons)


def without_shortlist(options: Mapping[str, Any]) -> dict[str, Any]:
    """A self-organized head saved by an earlier release was built without a shortlist (a default since)."""
    return {**options, "shortlist": 0} if "shortlist" not in options else dict(options)


def reclusterings_per_epoch(options: Mapping[str, Any], steps_per_epoch: int) -> int:
    """``K`` for about ``reclusters_per_epoch`` re-clusterings in an epoch of ``steps_per_epoch`` optimizer steps
    (a task whose step is not a batch of the corpus's tokens, which the head's own choice of ``K`` assumes);
    ``options`` hold every option, the defaults filled in."""
    return max(1, round(steps_per_epoch / float(options["reclusters_per_epoch"])))


def widened_weight_refusal(options: Mapping[str, Any], head_state: Mapping[str, Any]) -> str | None:
    """A banded head (``div_value``) saved by an earlier release kept its word vectors in one widened ``weight``:
    it loads (its bands are cut from it), but its optimizer state does not fit the band weights."""
    if options.get("div_value") is None or "weight" not in head_state:
        return None
    return ("was written by an earlier sohsm whose banded head (div_value) kept its word vectors in one widened "
            "weight: its weights load (sohsm lm eval and generate read it), but its optimizer state does not fit the "
            "band weights of this release; resume it with the release that wrote it, or start a new run")
