"""ROUGE against hand-checked figures (docs/s2s.md works them out) and against rouge-score for one reference."""
import pytest
from rouge_score import rouge_scorer

from sohsm.rouge import corpus_rouge, rouge, tokenize, truncate_bytes

# (hypothesis, references, {measure: (precision, recall)}), counted by hand on the stemmed tokens
HAND_CHECKED = [
    ("the cat sat on the mat", ["the cat was on the mat"],
     {"rouge1": (5 / 6, 5 / 6), "rouge2": (3 / 5, 3 / 5), "rougeL": (5 / 6, 5 / 6)}),
    # two references pooled: hits and lengths summed over references (ROUGE-1.5.5 -f A)
    ("police killed the gunman", ["police kill gunman", "the gunman was shot by police"],
     {"rouge1": (6 / 8, 6 / 9), "rouge2": (2 / 6, 2 / 7), "rougeL": (5 / 8, 5 / 9)}),
    # stemming: "rejects" ~ "rejected", "talks" ~ "talk" ("cambodia" !~ "cambodian"); case and the full stop ignored
    ("Cambodia rejects talks.", ["cambodian leader rejected the talk"],
     {"rouge1": (2 / 3, 2 / 5), "rouge2": (0.0, 0.0), "rougeL": (2 / 3, 2 / 5)}),
]


@pytest.mark.parametrize("hypothesis,references,expected", HAND_CHECKED)
def test_hand_checked_examples(hypothesis, references, expected):
    scores = rouge(hypothesis, references)
    for measure, (precision, recall) in expected.items():
        assert scores[measure].precision == pytest.approx(precision), measure
        assert scores[measure].recall == pytest.approx(recall), measure
        f = 0.0 if precision * recall == 0 else 2 * precision * recall / (precision + recall)
        assert scores[measure].fmeasure == pytest.approx(f), measure


def test_stems_and_tokens_are_rouge_155s():
    assert tokenize("Cambodia rejects talks, U.S.-led") == ["cambodia", "reject", "talk", "u", "s", "led"]


def test_one_reference_agrees_with_rouge_score():
    scorer = rouge_scorer.RougeScorer(["rouge1", "rouge2", "rougeL"], use_stemmer=True)
    pairs = [("nec UNK in computer sales tie-up", "nec <unk> computer sales tie up announced"),
             ("a b c d e f", "c d a b e"), ("hun sen rejects talks abroad", "cambodian government rejects talks")]
    for hypothesis, reference in pairs:
        ours, theirs = rouge(hypothesis, [reference]), scorer.score(reference, hypothesis)
        for measure in ("rouge1", "rouge2", "rougeL"):
            assert ours[measure].fmeasure == pytest.approx(theirs[measure].fmeasure)


def test_pooling_is_not_the_best_single_reference():
    best_single = max(rouge("police killed the gunman", [r])["rouge1"].recall
                      for r in ["police kill gunman", "the gunman was shot by police"])
    assert best_single == 1.0
    assert rouge("police killed the gunman", ["police kill gunman", "the gunman was shot by police"]
                 )["rouge1"].recall == pytest.approx(6 / 9)


def test_75_bytes_cut_mid_word_and_the_corpus_mean():
    long = "word " * 20  # 100 bytes: the cut leaves 15 words
    assert truncate_bytes(long, 75) == long[:75]
    scores = corpus_rouge([long, "other"], [["word"], ["other words"]], byte_limit=75)
    assert scores.scores["rouge1"].recall == pytest.approx(100 * (1 + 1 / 2) / 2)
    assert "-b 75" in scores.options and scores.count == 2


def test_mismatched_lengths_are_refused():
    with pytest.raises(ValueError, match="2 hypotheses but 1"):
        corpus_rouge(["a", "b"], [["a"]])
