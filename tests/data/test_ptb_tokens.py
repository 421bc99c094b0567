"""PTB-style tokens of raw news text, as the released Gigaword headline data writes them."""
import nltk
import pytest

from sohsm.data.ptb_tokens import first_sentence, tokenize

CASES = [
    # brackets, currency, percent, inner number punctuation, the final period
    ("Taiwan's exports to the U.S. rose 5.2% (US$1.3 billion) in May, officials said.",
     "Taiwan 's exports to the U.S. rose 5.2 % -LRB- US$ 1.3 billion -RRB- in May , officials said ."),
    ("Prices rose NT$15,840 at 10:30 a.m. Friday.", "Prices rose NT$ 15,840 at 10:30 a.m. Friday ."),
    ("It cost $5.", "It cost $ 5 ."),
    # double quotes open and close; the period before a closing quote ends the sentence
    ('He said: "We cannot go." Then he left.', "He said : `` We can not go . '' Then he left ."),
    ('"Yes," he said.', "`` Yes , '' he said ."),
    # single quotes, clitics, possessive plural
    ("`Taiwan' said the parties' chiefs don't know.", "` Taiwan ' said the parties ' chiefs do n't know ."),
    ("It won't.", "It wo n't ."),
    ("the Commission (FCC)'s decision", "the Commission -LRB- FCC -RRB- 's decision"),
    # slash escaped, dashes, ellipsis, semicolon
    ("The 9/11 attacks -- and more... were; over", "The 9\\/11 attacks -- and more ... were ; over"),
    ("word--word", "word -- word"),
    # abbreviations keep their period; a sentence-final one gets a period token after it
    ("Mr. Lee met Dr. Wang in Washington, D.C. on Monday.", "Mr. Lee met Dr. Wang in Washington , D.C. on Monday ."),
    ("He lives in the U.S.", "He lives in the U.S. ."),
    ("J. Smith of Acme Corp. said so.", "J. Smith of Acme Corp. said so ."),
    # a lower-case word after a period is no sentence start; a capital after a normal word is
    ("It rose approx. five percent. Then it fell.", "It rose approx. five percent . Then it fell ."),
    # SGML entities stay
    ("Lai &amp; Chen (Taipei).", "Lai &amp; Chen -LRB- Taipei -RRB- ."),
    # hyphenated words and numbers stay whole
    ("US-Japan ties, 1,000.5 tons", "US-Japan ties , 1,000.5 tons"),
    # a currency's letters stay with its `$` even without a number after it (`nt$` is a word of the released titles)
    ("NT$ DROPS TO 10-YEAR LOW", "NT$ DROPS TO 10-YEAR LOW"),
    # opening single quotes become ` (as the released titles write them); a closing one stays '
    ("at the 'Democracy Square,'\" said", "at the ` Democracy Square , ' '' said"),
    # a word is split at an inner apostrophe (the released titles hold `t`, `m` and `pore`, not `gov't`, `m'land` or
    # `s'pore`), a name is not (`o'neill`, `d'ivoire`, `xi'an` are words of both dictionaries)
    ("M'LAND, S'PORE GOV'T TALKS", "M ' LAND , S ' PORE GOV ' T TALKS"),
    ("O'Neill met D'Ivoire's envoy in Xi'an", "O'Neill met D'Ivoire 's envoy in Xi'an"),
    # NLTK's conventions, each a token of the released dictionaries (`'n`, `\*`, `...`), none of which holds a
    # word joined to the next by `:`, `,` or `...`
    ("Cookies 'N Cream bars", "Cookies 'N Cream bars"),
    ("RELATIONS WITH DOMINICA:MOFA", "RELATIONS WITH DOMINICA : MOFA"),
    ("the value,which rose", "the value , which rose"),
    ("the crash...was over", "the crash ... was over"),
    ("*Exchange rates", "\\* Exchange rates"),
    # a sentence end inside the paragraph splits a clitic as the last one does
    ("It won't. Then he left.", "It wo n't . Then he left ."),
]


@pytest.mark.parametrize("text, tokens", CASES)
def test_tokenize(text, tokens):
    assert tokenize(text) == tokens.split(" ")


def test_no_downloaded_nltk_data_is_needed(monkeypatch):
    """NLTK's word tokenizer is rules only: with no NLTK data folder to look in, tokens are the same."""
    monkeypatch.setattr(nltk.data, "path", [])
    text, tokens = CASES[0]
    assert tokenize(text) == tokens.split(" ")


def test_line_breaks_are_spaces():
    assert tokenize("Qian Qichen\nwas   skeptical\n.") == tokenize("Qian Qichen was skeptical .")


@pytest.mark.parametrize("tokens, expected", [
    ("a b . c d .", "a b ."),
    ("a ? b ! c . d", "a ? b ! c ."),  # only `.` ends it, as in Rush et al.'s pipeline
    ("no end here", "no end here"),
    ("", ""),
])
def test_first_sentence(tokens, expected):
    assert first_sentence(tokens.split()) == expected.split()
