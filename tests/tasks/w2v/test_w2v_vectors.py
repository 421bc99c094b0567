"""Analogies, similarity and neighbours against brute-force references (and scipy's Spearman)."""
import numpy as np
import pytest
import torch

from sohsm.tasks.w2v.vectors import WordVectors, analogy_accuracy, neighbours, similarity_correlation, spearman


def random_vectors(n=40, d=5, seed=0):
    g = torch.Generator().manual_seed(seed)
    return WordVectors([f"w{i}" for i in range(n)], torch.randn(n, d, generator=g), np.ones(n))


def test_analogies_match_a_brute_force_3cosadd(tmp_path):
    vectors = random_vectors()
    rng = np.random.default_rng(1)
    questions = [tuple(f"w{i}" for i in rng.choice(40, 4, replace=False)) for _ in range(60)]
    unit = (vectors.vectors / vectors.vectors.norm(dim=1, keepdim=True)).double()
    right = 0
    for a, b, c, d in questions:
        ia, ib, ic, id_ = (int(w[1:]) for w in (a, b, c, d))
        scores = unit @ (unit[ib] - unit[ia] + unit[ic])
        scores[[ia, ib, ic]] = -np.inf
        right += int(scores.argmax()) == id_
    # make some questions answerable so the count is not trivially 0
    for a, b, c in [("w1", "w2", "w3"), ("w4", "w5", "w6")]:
        ia, ib, ic = int(a[1:]), int(b[1:]), int(c[1:])
        scores = unit @ (unit[ib] - unit[ia] + unit[ic])
        scores[[ia, ib, ic]] = -np.inf
        questions.append((a, b, c, f"w{int(scores.argmax())}"))
        right += 1
    lines = ([": one"] + [" ".join(q).upper() for q in questions[:30]]
             + [": two"] + [" ".join(q) for q in questions[30:]])
    lines.append("w1 w2 w3 unknown")
    path = tmp_path / "q.txt"
    path.write_text("\n".join(lines) + "\n")
    result = analogy_accuracy(vectors, path, batch_size=7)
    assert (result.correct, result.answered, result.total) == (right, 62, 63)
    assert set(result.sections) == {"one", "two"} and result.sections["one"][1] == 30  # upper case found lower-cased


def test_spearman_matches_scipy_with_ties():
    scipy_stats = pytest.importorskip("scipy.stats", reason="scipy (a dependency of the dev extra's gensim) is the "
                                                            "reference")
    rng = np.random.default_rng(2)
    x, y = rng.integers(0, 6, 50).astype(float), rng.normal(size=50)
    assert spearman(x, y) == pytest.approx(scipy_stats.spearmanr(x, y).statistic, abs=1e-12)


def test_similarity_uses_pairs_in_the_vocabulary(tmp_path):
    vectors = random_vectors()
    path = tmp_path / "pairs.tsv"
    path.write_text("# Word 1\tWord 2\tHuman\nw1\tw2\t3\nw3\tw4\t1.5\nw5\tzz\t2\nw6\tw1\t7\n")
    unit = vectors.unit()
    cosines = [float(unit[a] @ unit[b]) for a, b in ((1, 2), (3, 4), (6, 1))]
    result = similarity_correlation(vectors, path)
    assert (result.pairs, result.total) == (3, 4)
    assert result.spearman == pytest.approx(spearman(np.array([3, 1.5, 7]), np.array(cosines)))


def test_neighbours_are_the_highest_cosines():
    vectors = random_vectors()
    found = neighbours(vectors, "w3", k=5)
    unit = vectors.unit()
    cos = unit @ unit[3]
    cos[3] = -2
    assert [w for w, _ in found] == [f"w{i}" for i in cos.topk(5).indices.tolist()]
    with pytest.raises(ValueError, match="'nope' is not in the vocabulary"):
        neighbours(vectors, "nope")
