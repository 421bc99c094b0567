"""Rush et al.'s headline pairs from English Gigaword SGML: reading, each of NAMAS's filters, test-set overlap,
the dev split, atomic output; and the numbers of the two CNA months of the data directory."""
from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from disk import fill_disk
from needs import REPO_ROOT, need_files
from sohsm.atomic_writes import WriteError
from sohsm.data.errors import DataError
from sohsm.data.gigaword import (
    FILTERS,
    REPORT_FILE,
    Pair,
    TestArticles,
    blacklisted,
    finish,
    first_paragraph,
    in_valid,
    load_test_articles,
    make_pairs,
    namas_filter,
    prepare,
    strip_dateline,
)
from sohsm.data.gigaword_sgml import Document, gigaword_files, read_documents
from sohsm.data.headlines import PAIR_FILES, load_pairs_folder

LEAD = ("Mainland Chinese Foreign Minister Qian Qichen was highly skeptical of Tokyo's explanations of the "
        "newly published US-Japan guidelines on Monday.")


def doc(id_="CNA_ENG_19971001.0001", headline="QIAN QICHEN DUBIOUS OF NEW DEFENSE GUIDELINES", paragraphs=(LEAD,),
        type_="story", dateline="Tokyo, Oct. 1 (CNA)\n(By Lai Sheng-chuan &amp; Eva Chen)") -> str:
    """One Gigaword ``<DOC>`` as LDC writes it (tags on their own lines, text wrapped)."""
    body = "".join(f"<P>\n{p}\n</P>\n" for p in paragraphs)
    return (f'<DOC id="{id_}" type="{type_}" >\n<HEADLINE>\n{headline}\n</HEADLINE>\n'
            f"<DATELINE>\n{dateline}\n</DATELINE>\n<TEXT>\n{body}</TEXT>\n</DOC>\n")


def write_gz(path: Path, *docs: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(path, "wt", encoding="utf-8") as handle:
        handle.write("".join(docs))
    return path


def story(headline: str, article: str) -> Pair:
    return Pair(article.split(), headline.split())


ARTICLE = "the minister said on monday that taiwan would join the trade organization soon ."


# -- reading the SGML --------------------------------------------------------------------------------
def test_read_documents(tmp_path):
    path = write_gz(tmp_path / "cna_eng_199710.gz", doc(), doc("X.2", "MULTI", ("a", "b"), type_="multi"))
    first, second = list(read_documents(path))
    assert (first.id, first.type, first.headline) == ("CNA_ENG_19971001.0001", "story",
                                                      "QIAN QICHEN DUBIOUS OF NEW DEFENSE GUIDELINES")
    assert first.paragraphs == [LEAD] and first.dateline.startswith("Tokyo, Oct. 1 (CNA)")
    assert (second.type, second.paragraphs) == ("multi", ["a", "b"])


def test_text_without_paragraph_tags_is_split_at_blank_lines(tmp_path):
    text = '<DOC id="A.1" type="story" >\n<HEADLINE>\nH\n</HEADLINE>\n<TEXT>\nfirst\nblock\n\nsecond\n</TEXT>\n</DOC>\n'
    (document,) = read_documents(write_gz(tmp_path / "a.gz", text))
    assert document.paragraphs == ["first block", "second"]


def test_progress_counts_every_compressed_byte(tmp_path):
    path = write_gz(tmp_path / "a.gz", *(doc(f"A.{i}") for i in range(200)))
    seen = []
    assert len(list(read_documents(path, seen.append))) == 200
    assert sum(seen) == path.stat().st_size


@pytest.mark.parametrize("content, message", [
    (b"hello world\n", "not English Gigaword SGML (line 1 is text outside a <DOC>"),
    (b"", "not English Gigaword SGML (no <DOC>"),
    (b'<DOC id="A" type="story" >\n<HEADLINE>\nH\n', "cut short inside document A"),
])
def test_not_gigaword_sgml(tmp_path, content, message):
    path = tmp_path / "x.gz"
    path.write_bytes(gzip.compress(content))
    with pytest.raises(DataError, match="^" + str(path).replace("\\", "\\\\") + ": ") as error:
        list(read_documents(path))
    assert message in str(error.value)


def test_not_gzip_or_cut_short(tmp_path):
    (tmp_path / "plain.gz").write_text("<DOC>")
    with pytest.raises(DataError, match="plain.gz: not a gzip file"):
        list(read_documents(tmp_path / "plain.gz"))
    whole = gzip.compress(doc().encode() * 50)
    (tmp_path / "cut.gz").write_bytes(whole[: len(whole) // 2])
    with pytest.raises(DataError, match="cut.gz: corrupt or cut short"):
        list(read_documents(tmp_path / "cut.gz"))


def test_gigaword_files(tmp_path):
    a = write_gz(tmp_path / "giga" / "cna" / "b.gz", doc())
    b = write_gz(tmp_path / "giga" / "afp" / "a.gz", doc())
    assert gigaword_files([tmp_path / "giga"]) == sorted([a, b])
    assert gigaword_files([a, tmp_path / "giga"]) == sorted([a, b])  # each once
    (tmp_path / "empty").mkdir()
    (tmp_path / "notes.txt").write_text("x")
    for given, message in ((tmp_path / "missing", "no such file or folder"), (tmp_path / "empty", "no .gz files"),
                           (tmp_path / "notes.txt", "not a .gz file")):
        with pytest.raises(DataError, match=message):
            gigaword_files([given])


# -- bylines, datelines, a story's pair ----------------------------------------------------------------
@pytest.mark.parametrize("paragraph, kept", [
    ("WASHINGTON (AP) _ The Senate voted.", "The Senate voted."),
    ("NEW YORK _ Stocks fell.", "Stocks fell."),
    ("BEIJING, March 1 (Xinhua) -- China's exports rose.", "China's exports rose."),
    ("ST. LOUIS, Oct. 3 (AP) _ \"We won,\" he said.", "\"We won,\" he said."),
    ("LOS ANGELES, Calif. -- A man was hurt.", "A man was hurt."),
    ("Taipei, March 20 (CNA) President Chen won.", "President Chen won."),
    # not datelines
    ("U.S. exports rose.", None),
    ("AIDS -- the disease -- spread.", None),
    ("The WTO (World Trade Organization) said.", None),
    ("Taiwan (ROC) officials said.", None),
])
def test_strip_dateline(paragraph, kept):
    assert strip_dateline(paragraph) == (paragraph if kept is None else kept)


def test_a_byline_paragraph_is_skipped():
    document = Document("A", "story", "H", "", ["By Lilian Wu CNA staff", "Taipei, March 20 (CNA) Chen won.", "More."])
    assert first_paragraph(document) == "Chen won."
    assert first_paragraph(Document("A", "story", "H", "", ["(By Sofia Wu)"])) is None
    # a sentence that starts with "By" is no byline
    assert first_paragraph(Document("A", "story", "H", "", ["By the end of May, exports rose."])) == \
        "By the end of May, exports rose."


def test_prepare_takes_the_headline_and_the_first_sentence_with_digits_as_hashes():
    document = Document("A", "story", "EXPORTS UP 5.2 PCT IN 1997", "Taipei (CNA)",
                        ["Exports rose 5.2 percent in 1997, officials said. They fell in 1998.", "Second."])
    pair = prepare(document)
    assert pair.title == "EXPORTS UP #.# PCT IN ####".split()
    assert pair.article == "Exports rose #.# percent in #### , officials said .".split()
    assert prepare(Document("A", "multi", "H", "", ["x."])) == "not a story"
    assert prepare(Document("A", "story", "", "", ["x."])) == "no headline or text"
    assert prepare(Document("A", "story", "H", "", [])) == "no headline or text"


# -- NAMAS's filters, one at a time ----------------------------------------------------------------------
@pytest.mark.parametrize("headline, article, reason", [
    ("taiwan to join trade organization", ARTICLE, None),
    ("taiwan to join trade organization", ARTICLE.replace(" .", ""), "no sentence end"),
    # the blacklist is matched as a substring of the lower-cased headline, as NAMAS does: `ap` in `japan`
    ("JAPAN to join trade organization", ARTICLE, "blacklisted headline"),
    ("taiwan joins trade organization : minister", ARTICLE, "blacklisted headline"),
    ("taiwan joins trade organization -lrb- wto -rrb-", ARTICLE, "blacklisted headline"),
    ("update # : taiwan to join trade organization", ARTICLE, "blacklisted headline"),
    ("will taiwan join the organization ?", ARTICLE, "blacklisted headline"),
    ("taiwan joined by trade organization", ARTICLE, "blacklisted headline"),
    ("i taiwan to join trade organization", ARTICLE, None),  # ' i ' needs a space on both sides
    # article 11 to 99 tokens, headline 4 to 49 tokens (punctuation counted)
    ("taiwan to join trade organization", "taiwan would join the trade organization , he said .", "article length"),
    ("taiwan to join trade organization", "taiwan would join the trade organization soon , he said , too .", None),
    ("taiwan to join trade organization", " ".join(["word"] * 98) + " taiwan .", "article length"),
    ("taiwan to join trade organization", " ".join(["word"] * 97) + " taiwan .", None),
    ("taiwan joins organization", ARTICLE, "headline length"),
    ("taiwan joins organization ,", ARTICLE, None),
    ("taiwan " + "x " * 49, ARTICLE, "headline length"),
    ("taiwan " + "x " * 48, ARTICLE, None),
    # a shared word longer than three characters, any case; no stop list
    ("china plans new tariffs", ARTICLE, "no shared word"),
    ("TAIWAN plans new tariffs", ARTICLE, None),
    ("the one who was in", ARTICLE, "no shared word"),
])
def test_namas_filters(headline, article, reason):
    assert namas_filter(story(headline, article)) == reason


def test_blacklisted_names_the_first_entry_held():
    assert blacklisted("JAPAN : TAIWAN".split()) == "ap"  # `ap` comes before ` : ` in NAMAS's list
    assert blacklisted("CHEN : TAIWAN".split()) == " : "
    assert blacklisted(": TAIWAN WINS".split()) is None  # ` : ` needs a space before it
    assert blacklisted("TAIWAN WINS".split()) is None


def test_every_filter_has_a_row():
    assert set(FILTERS) >= {"no sentence end", "blacklisted headline", "article length", "headline length",
                            "no shared word", "in a test set", "not a story"}


def test_finish_lowercases_and_drops_the_headlines_punctuation():
    pair = story("`` Taiwan '' Joins , Trade -- Group \\/ 9\\/11 .", "Taiwan Joins .")
    assert finish(pair) == (["taiwan", "joins", "."], ["taiwan", "joins", "trade", "group", "9\\/11"])


# -- test sets and the dev split ---------------------------------------------------------------------------
def test_test_articles_match_word_for_word_with_unk_as_any_word():
    tests = TestArticles({"gigaword": [["UNK", "rose", "#.#", "percent", "."]], "duc2004": [["a", "b", "."]]})
    assert tests.find(["exports", "rose", "#.#", "percent", "."]) == "gigaword"
    assert tests.find(["exports", "rose", "#.#", "percent", "!"]) is None
    assert tests.find(["exports", "rose", "#.#", "percent", ".", "x"]) is None
    assert tests.find(["a", "b", "."]) == "duc2004" and tests.find([]) is None
    assert len(tests) == 2


def test_load_test_articles_reads_the_sets_present_and_hashes_ducs_digits(tmp_path):
    (tmp_path / "duc2004").mkdir()
    (tmp_path / "duc2004" / "input.txt").write_text("exports rose 5.2 percent in 1997 .\n")
    tests = load_test_articles(tmp_path)
    assert tests.names == ("duc2004",)
    assert tests.find("exports rose #.# percent in #### .".split()) == "duc2004"


def test_dev_split_is_by_document_id_and_about_the_share():
    ids = [f"AFP_ENG_2008{i:05d}" for i in range(20_000)]
    share = sum(in_valid(i, 0.05) for i in ids) / len(ids)
    assert 0.04 < share < 0.06
    assert [in_valid(i, 0.05) for i in ids[:100]] == [in_valid(i, 0.05) for i in ids[:100]]
    assert all(in_valid(i, 0.05) <= in_valid(i, 0.5) for i in ids[:1000])  # a larger share only adds


# -- make_pairs ------------------------------------------------------------------------------------------
def _stories(n: int, prefix: str = "CNA_ENG_1997100") -> list[str]:
    return [doc(f"{prefix}{i}.{i:04d}", f"TAIWAN MINISTER NUMBER {i} VISITS EUROPE",
                (f"Taiwan's minister number {i} left for Europe on Monday to promote trade ties, "
                 "officials said.",)) for i in range(n)]


def test_make_pairs_writes_aligned_files_and_counts_every_drop(tmp_path):
    docs = _stories(30) + [
        doc("M.1", type_="multi"),
        doc("B.1", "JAPAN MINISTER VISITS EUROPE", ("Taiwan's minister left for Europe on Monday, officials said.",)),
        doc("T.1", "TAIWAN MINISTER IN TEST SET", ("Taiwan's minister was in a test set on Monday, he said today.",)),
    ]
    inputs = write_gz(tmp_path / "giga" / "cna_eng_199710.gz", *docs)
    tests = TestArticles({"gigaword": [("taiwan 's minister was in a UNK set on monday , he said today .").split()]})
    report = make_pairs([inputs.parent], tmp_path / "out", valid_share=0.3, tests=tests)
    assert report.documents == 33 and report.written["train"] + report.written["valid"] == 30
    assert report.written["valid"] > 0 and report.written["train"] > 0
    assert {k: v for k, v in report.dropped.items() if v} == {"not a story": 1, "blacklisted headline": 1,
                                                                "in a test set": 1}
    pairs = load_pairs_folder(tmp_path / "out")
    assert len(pairs.train) == report.written["train"] and len(pairs.valid) == report.written["valid"]
    assert pairs.train.targets[0][:2] == ["taiwan", "minister"]
    assert pairs.train.sources[0][:3] == ["taiwan", "'s", "minister"]
    saved = json.loads((tmp_path / "out" / REPORT_FILE).read_text())
    assert saved["dropped"] == report.dropped and saved["written"] == report.written
    assert "dropped: blacklisted headline" in report.table() and saved["blacklisted"] == {"ap": 1}


def test_make_pairs_refuses_no_dev_pair_and_writes_nothing(tmp_path):
    inputs = write_gz(tmp_path / "a.gz", *_stories(3))
    with pytest.raises(DataError, match="no dev pair left of 3 documents"):
        make_pairs([inputs], tmp_path / "new" / "out", valid_share=1e-9)
    assert not (tmp_path / "new").exists()
    with pytest.raises(ValueError, match="valid_share must be in"):
        make_pairs([inputs], tmp_path / "out", valid_share=1.0)


def test_a_failed_run_leaves_the_folder_as_it_was(tmp_path, monkeypatch):
    inputs = write_gz(tmp_path / "a.gz", *_stories(40))
    out = tmp_path / "out"
    make_pairs([inputs], out, valid_share=0.3)
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    more = write_gz(tmp_path / "b.gz", *_stories(40, "AFP_ENG_2000"))
    with monkeypatch.context() as patch:
        fill_disk(patch, "train.article.txt", room=500)
        with pytest.raises(WriteError, match="train.article.txt: No space left on device"):
            make_pairs([inputs, more], out, valid_share=0.3)
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before  # no temporary file left, nothing replaced
    (tmp_path / "corrupt.gz").write_bytes(b"junk")
    with pytest.raises(DataError, match="not a gzip file"):
        make_pairs([inputs, tmp_path / "corrupt.gz"], out, valid_share=0.3)
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before


def test_load_pairs_folder_names_what_is_missing(tmp_path):
    with pytest.raises(DataError, match="no such folder of headline pairs"):
        load_pairs_folder(tmp_path / "missing")
    (tmp_path / PAIR_FILES["train"][0]).write_text("a .\n")
    with pytest.raises(DataError, match="train.title.txt, valid.article.txt, valid.title.txt missing"):
        load_pairs_folder(tmp_path)


# -- the two CNA months of the data directory ------------------------------------------------------------------
CNA = ("gigaword-raw-sgml/cna_eng_199710.gz", "gigaword-raw-sgml/cna_eng_200403.gz")
HOW = "two LDC English Gigaword months (cna_eng_199710.gz, cna_eng_200403.gz); see docs/s2s.md"


@pytest.fixture(scope="module")
def cna_pairs(tmp_path_factory):
    root = need_files("English Gigaword SGML", HOW, *CNA)
    out = tmp_path_factory.mktemp("cna-pairs")
    report = make_pairs([root / f for f in CNA], out, tests=load_test_articles(root))
    return report, out


def test_cna_months(cna_pairs):
    report, out = cna_pairs
    assert report.documents == 921 + 1071  # as the data directory's SOURCES counts them
    assert report.dropped["not a story"] == (921 - 898) + (1071 - 728)
    assert set(report.test_sets) == {"gigaword", "duc2004", "duc2003"}
    kept = report.documents - sum(report.dropped.values())
    assert kept == report.written["train"] + report.written["valid"] > 1000
    pairs = load_pairs_folder(out)
    for article, title in zip(pairs.train.sources, pairs.train.targets):
        assert 10 < len(article) < 100 and article[-1] == "." and article.count(".") == 1
        assert all(not any(c.isdigit() or c.isupper() for c in w) for w in article + title)
        assert not {w for w in title if len(w) > 3}.isdisjoint({w for w in article if len(w) > 3})
        assert "ap" not in " ".join(title)


def test_cna_tokens_are_the_released_datas(cna_pairs):
    """Nearly every word the CNA pairs hold is a word of Rush et al.'s released training vocabulary (words
    seen 5 times or more in their 3.8M pairs): the tokenisation matches theirs. docs/s2s.md shows both shares."""
    root = need_files("Gigaword's released dictionaries", HOW, "gigaword/dict/train.article.dict",
                      "gigaword/dict/train.title.dict", *CNA)
    _, out = cna_pairs
    shares = {}
    for side, file in zip(("article", "title"), PAIR_FILES["train"]):
        known = {line.split()[0] for line in open(root / f"gigaword/dict/train.{side}.dict", encoding="utf-8")}
        words = [w for line in open(out / file, encoding="utf-8") for w in line.split()]
        unknown = sum(w not in known for w in words)
        shares[side] = 1 - unknown / len(words)
    assert shares["article"] > 0.99 and shares["title"] > 0.99, shares
    docs = (REPO_ROOT / "docs" / "s2s.md").read_text(encoding="utf-8")
    shown = " ".join(docs.split())
    assert (f"{100 * shares['article']:.1f}% of the training article tokens are words of its article dictionary and "
            f"{100 * shares['title']:.1f}% of the training title tokens words of its title dictionary") in shown, shares
