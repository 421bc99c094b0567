"""Self-organisation really happens, measured against the random start.

A corpus is drawn from a class-based bigram language with planted word classes:
the next word's class depends on the previous word's class only (a peaked
class-transition matrix), and the word is drawn inside its class from a Zipf
distribution. A bigram model (an embedding of the previous word, of size 6,
below the 20 classes, straight into the head) is trained twice from the same
initial weights and the same random clusters: once with
:class:`SelfOrganizedSoftmax` re-clustering every ``K`` optimizer steps, once
with :class:`TwoLevelSoftmax` keeping those random clusters fixed.

What is asserted, over three seeds with thresholds fixed before they were run
(full recovery of the planted classes is not expected: Algorithm 1 is a greedy,
local search; and the gain shows only where the model's capacity is limited):

- on every seed the self-organised model's dev perplexity is below the fixed one's,
  and on average over the seeds at least 3% below;
- on every seed the normalised mutual information between its final clusters and
  the planted classes is at least twice that of the random start.

NMI here is the mutual information between the two labellings of the 400 words
(every word counted once, not weighted by frequency), divided by the arithmetic
mean of their two entropies (``I(A; B) / ((H(A) + H(B)) / 2)``, the default of
scikit-learn's ``normalized_mutual_info_score``).
"""
from __future__ import annotations

import bisect
import math
import time
from typing import NamedTuple

import pytest
import torch
from torch import Tensor, nn

from sohsm.heads import Reclustering, SelfOrganizedSoftmax, TwoLevelSoftmax

N_WORDS = 400
N_CLASSES = 20  # planted classes, each of mass 1/20 (the transition matrix is doubly stochastic)
N_CLUSTERS = 20  # ceil(sqrt(400))
HIDDEN = 6  # below the number of classes: the model's capacity is what the clusters must make up for

SEED = 0


class Language(NamedTuple):
    classes: Tensor  # [N_WORDS] planted class of each word
    transition: Tensor  # [N_CLASSES, N_CLASSES] P(next class | class), float64, doubly stochastic
    emission: Tensor  # [N_CLASSES, N_WORDS] P(word | class), zero outside the class, float64


def make_language(generator: torch.Generator, successors: int = 3, peak: float = 0.9) -> Language:
    """20 balanced classes of 20 words; each class has ``successors`` likely next classes.

    The transition matrix is ``(1 - peak) / 20`` everywhere plus ``peak`` shared between
    ``successors`` random permutation matrices, so it is doubly stochastic and every class
    has stationary mass exactly 1/20. Inside a class, word ``r`` (in a random order) has
    probability proportional to ``1 / (r + 1)``.
    """
    classes = torch.empty(N_WORDS, dtype=torch.long)
    classes[torch.randperm(N_WORDS, generator=generator)] = torch.arange(N_WORDS) % N_CLASSES
    transition = torch.full((N_CLASSES, N_CLASSES), (1.0 - peak) / N_CLASSES, dtype=torch.float64)
    weights = torch.rand(successors, generator=generator, dtype=torch.float64) + 0.5
    weights *= peak / weights.sum()
    rows = torch.arange(N_CLASSES)
    for weight in weights.tolist():
        transition[rows, torch.randperm(N_CLASSES, generator=generator)] += weight
    emission = torch.zeros(N_CLASSES, N_WORDS, dtype=torch.float64)
    for c in range(N_CLASSES):
        words = (classes == c).nonzero().squeeze(1)
        words = words[torch.randperm(words.numel(), generator=generator)]
        zipf = 1.0 / torch.arange(1, words.numel() + 1, dtype=torch.float64)
        emission[c, words] = zipf / zipf.sum()
    return Language(classes, transition, emission)


def sample_corpus(language: Language, n_tokens: int, generator: torch.Generator) -> Tensor:
    """``[n_tokens]`` word ids: a run of the class Markov chain, then a word from each class."""
    cumulative = language.transition.cumsum(1).tolist()
    uniforms = torch.rand(n_tokens, generator=generator, dtype=torch.float64).tolist()
    c = int(torch.randint(N_CLASSES, (1,), generator=generator))
    chain = []
    for u in uniforms:
        c = min(bisect.bisect_right(cumulative[c], u), N_CLASSES - 1)
        chain.append(c)
    chain = torch.tensor(chain)
    words = torch.empty(n_tokens, dtype=torch.long)
    for c in range(N_CLASSES):
        at = (chain == c).nonzero().squeeze(1)
        if at.numel():
            words[at] = torch.multinomial(language.emission[c], at.numel(), replacement=True, generator=generator)
    return words


def nmi(a: Tensor, b: Tensor) -> float:
    """Normalised mutual information of two labellings: ``I(A; B) / mean(H(A), H(B))``."""
    joint = torch.zeros(int(a.max()) + 1, int(b.max()) + 1, dtype=torch.float64)
    joint.index_put_((a.long(), b.long()), torch.ones(a.numel(), dtype=torch.float64), accumulate=True)
    joint /= a.numel()
    pa, pb = joint.sum(1), joint.sum(0)
    nz = joint > 0
    mi = float((joint[nz] * (joint[nz] / (pa[:, None] * pb[None, :])[nz]).log()).sum())
    h = [float(-(p[p > 0] * p[p > 0].log()).sum()) for p in (pa, pb)]
    return mi / ((h[0] + h[1]) / 2)


def test_nmi_helper():
    """The NMI above: 1 for a relabelled copy, 0 for independent labellings, sklearn's value on a small case."""
    a = torch.tensor([0, 0, 1, 1, 2, 2])
    assert nmi(a, (a + 1) % 3) == pytest.approx(1.0)
    assert nmi(torch.tensor([0, 0, 1, 1]), torch.tensor([0, 1, 0, 1])) == pytest.approx(0.0, abs=1e-12)
    # sklearn.metrics.normalized_mutual_info_score([0, 0, 1, 1], [0, 0, 1, 2]) == 0.8
    assert nmi(torch.tensor([0, 0, 1, 1]), torch.tensor([0, 0, 1, 2])) == pytest.approx(0.8)


class BigramLM(nn.Module):
    """The previous word's embedding is the hidden state (size ``head.in_features``)."""

    def __init__(self, head) -> None:
        super().__init__()
        self.embed = nn.Embedding(N_WORDS, head.in_features)
        self.head = head


class Scores(NamedTuple):
    ppl: float
    ppl_cluster: float
    ppl_in_cluster: float


@torch.no_grad()
def dev_scores(model: BigramLM, corpus: Tensor) -> Scores:
    """Dev perplexities (Eq. 5-6) of ``P(w_t | w_t-1)``, model in eval mode."""
    model.eval()
    parts = model.head.score_parts(model.embed(corpus[:-1]), corpus[1:])
    model.train()
    cluster, in_cluster = -parts.cluster.double().mean(), -parts.in_cluster.double().mean()
    return Scores(math.exp(cluster + in_cluster), math.exp(cluster), math.exp(in_cluster))


def train(model: BigramLM, corpus: Tensor, epochs: int, batch: int, lr: float, seed: int) -> None:
    """Adagrad on shuffled (previous word, word) pairs; the head is attached to the optimizer."""
    optimizer = torch.optim.Adagrad(model.parameters(), lr=lr)
    model.head.attach(optimizer)
    order_generator = torch.Generator().manual_seed(seed)
    n_pairs = corpus.numel() - 1
    for _ in range(epochs):
        order = torch.randperm(n_pairs, generator=order_generator)
        for start in range(0, n_pairs - batch + 1, batch):
            rows = order[start : start + batch]  # (B,)
            loss = model.head(model.embed(corpus[rows]), corpus[rows + 1]).loss
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()


class Outcome(NamedTuple):
    so: Scores
    fixed: Scores
    nmi_start: float
    nmi_learned: float
    true_ppl: float
    history: list
    seconds: float


def self_organisation_experiment(
    seed: int = SEED,
    hidden: int = HIDDEN,
    n_train: int = 200_000,
    n_dev: int = 20_000,
    epochs: int = 5,
    batch: int = 1024,
    update_every: int = 50,
    lr: float = 0.5,
) -> Outcome:
    """Train the same bigram model with self-organised and with fixed random clusters."""
    began = time.perf_counter()
    data_generator = torch.Generator().manual_seed(1_000_003 + seed)  # not the clusters' seed
    language = make_language(data_generator)
    train_corpus = sample_corpus(language, n_train + 1, data_generator)
    dev_corpus = sample_corpus(language, n_dev + 1, data_generator)
    counts = torch.bincount(train_corpus[1:], minlength=N_WORDS)
    prev, word = dev_corpus[:-1], dev_corpus[1:]
    prev_class, word_class = language.classes[prev], language.classes[word]
    true_log_prob = (language.transition[prev_class, word_class] * language.emission[word_class, word]).log()
    true_ppl = math.exp(-float(true_log_prob.mean()))

    torch.manual_seed(seed)
    so_head = SelfOrganizedSoftmax(  # Algorithm 1 as the paper has it
        hidden, N_WORDS, counts=counts, n_clusters=N_CLUSTERS, init="random", seed=seed, shortlist=0,
        reclustering=Reclustering(gamma=1.5, freq_budget=0.1, update_every=update_every),
    )
    start = so_head.assignment.clone()
    so_model = BigramLM(so_head)
    torch.manual_seed(seed)  # the same initial weights: the heads draw their parameters alike
    fixed_model = BigramLM(TwoLevelSoftmax(hidden, N_WORDS, assignment=start, n_clusters=N_CLUSTERS))
    # one model, one start: before training the two are the same function
    assert dev_scores(so_model, dev_corpus) == dev_scores(fixed_model, dev_corpus)

    train(so_model, train_corpus, epochs, batch, lr, seed)
    train(fixed_model, train_corpus, epochs, batch, lr, seed)
    assert torch.equal(fixed_model.head.assignment, start)
    steps = epochs * (n_train // batch)
    assert len(so_head.history) == steps // update_every  # the E-step ran every K optimizer steps
    return Outcome(
        so=dev_scores(so_model, dev_corpus),
        fixed=dev_scores(fixed_model, dev_corpus),
        nmi_start=nmi(start, language.classes),
        nmi_learned=nmi(so_head.assignment, language.classes),
        true_ppl=true_ppl,
        history=list(so_head.history),
        seconds=time.perf_counter() - began,
    )


#: seeds of the statistical test; the thresholds below were fixed before these seeds were run
SEEDS = (0, 1, 2)


@pytest.mark.slow
def test_self_organisation_beats_fixed_random_clusters():
    """Self-organised clusters beat fixed random ones, over several seeds (thresholds set in advance).

    Asserted, for the head's defaults (no Eq. 1 projections): on every seed the self-organised
    head's dev perplexity is below that of fixed random clusters and its NMI with the planted
    classes is at least twice the random start's; over the seeds the perplexity is on average
    at least 3% lower. The gain comes from limited capacity (hidden size 6 < 20 classes): with
    enough capacity a 2-level softmax over any clustering can fit a low-rank language.
    """
    gains, lines = [], []
    for seed in SEEDS:
        outcome = self_organisation_experiment(seed)
        gain = 1.0 - outcome.so.ppl / outcome.fixed.ppl
        gains.append(gain)
        lines.append(
            f"  seed {seed}: dev ppl self-organised {outcome.so.ppl:.2f} (cluster {outcome.so.ppl_cluster:.2f} x "
            f"in-cluster {outcome.so.ppl_in_cluster:.2f}), fixed random {outcome.fixed.ppl:.2f}: "
            f"{100 * gain:.1f}% lower; true {outcome.true_ppl:.2f}; NMI {outcome.nmi_start:.3f} -> "
            f"{outcome.nmi_learned:.3f} ({outcome.nmi_learned / outcome.nmi_start:.2f}x); "
            f"empty clusters {outcome.history[-1]['empty_clusters']}; {outcome.seconds:.1f} s"
        )
        assert outcome.so.ppl < outcome.fixed.ppl, lines[-1]
        assert outcome.nmi_learned >= 2.0 * outcome.nmi_start, lines[-1]
    print(f"\nself-organisation ({N_WORDS} words, {N_CLASSES} classes, {N_CLUSTERS} clusters, hidden {HIDDEN})")
    print("\n".join(lines))
    mean_gain = sum(gains) / len(gains)
    assert mean_gain >= 0.03, f"mean gain {100 * mean_gain:.1f}% over seeds {SEEDS} is below 3%"
