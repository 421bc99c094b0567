"""Word clusterings for two-level softmaxes: random, frequency binning, and the
greedy re-assignment of the self-organized softmax (Shen et al. 2017, Algorithm 1).

An assignment is a ``[N]`` long tensor: ``assignment[w]`` is the cluster of word ``w``.
"""
from __future__ import annotations

import heapq
import math
from typing import NamedTuple

import torch
from torch import Tensor


def _word_count(n_words) -> int:
    """``n_words`` as an int; a float such as 10.5 or a string such as '10' is refused, not rounded."""
    if isinstance(n_words, bool) or not hasattr(n_words, "__index__") or int(n_words) < 1:
        raise ValueError(f"the number of words (n_classes) must be a positive integer, got {n_words!r} "
                         f"({type(n_words).__name__})")
    return int(n_words)


def default_n_clusters(n_words: int) -> int:
    """``ceil(sqrt(N))`` clusters, as in the paper."""
    return math.ceil(math.sqrt(_word_count(n_words)))


def default_max_cluster_size(n_words: int, gamma: float = 1.5) -> int:
    """Largest size a cluster may reach under the rule ``|c| < gamma * sqrt(N)`` (checked before adding)."""
    return math.ceil(gamma * math.sqrt(_word_count(n_words)))


def check_assignment(assignment: Tensor, n_words: int, n_clusters: int) -> Tensor:
    """Validate an assignment and return it as a CPU-independent long tensor of shape ``[N]``."""
    if not isinstance(assignment, Tensor):
        assignment = torch.as_tensor(assignment)
    if assignment.dim() != 1 or assignment.numel() != n_words:
        raise ValueError(
            f"assignment must have shape [{n_words}] (one cluster per word), got {tuple(assignment.shape)}"
        )
    if assignment.dtype not in (torch.int64, torch.int32, torch.int16, torch.uint8):
        raise ValueError(f"assignment must hold integer cluster ids, got {assignment.dtype}")
    assignment = assignment.long()
    if n_words and (int(assignment.min()) < 0 or int(assignment.max()) >= n_clusters):
        raise ValueError(
            f"assignment values must be in [0, {n_clusters}), got min {int(assignment.min())} "
            f"and max {int(assignment.max())}"
        )
    return assignment


def random_assignment(n_words: int, n_clusters: int, generator: torch.Generator | None = None) -> Tensor:
    """A uniformly random, balanced assignment: cluster sizes differ by at most one."""
    if n_clusters < 1 or n_clusters > n_words:
        raise ValueError(f"n_clusters must be in [1, {n_words}], got {n_clusters}")
    order = torch.randperm(n_words, generator=generator)
    assignment = torch.empty(n_words, dtype=torch.long)
    assignment[order] = torch.arange(n_words) % n_clusters
    return assignment


def frequency_binning(counts: Tensor, n_clusters: int) -> Tensor:
    """Class-based softmax clusters of Mikolov et al. (2011).

    Words sorted by descending frequency are cut into consecutive ranges, each
    holding about ``1 / n_clusters`` of the token mass. A word heavier than one
    share gets a cluster of its own; the running cluster index advances at most
    one step per word, so no cluster is left empty while words remain.

    Words never seen (count 0) carry no mass, so the binning says nothing of where
    they go; consecutive ranges would put them all in the last cluster (100,816 of
    Llama 3's 128,256 tokens on WikiText-2: one cluster as costly as the full
    softmax). Each goes instead to the cluster with the fewest words so far
    (:func:`_fill_smallest`), after the seen words are binned among themselves.

    Args:
        counts: ``[N]`` training counts of the words.
        n_clusters: number of clusters ``|C|``.
    """
    counts = torch.as_tensor(counts, dtype=torch.float64).reshape(-1)
    n_words = counts.numel()
    if n_clusters < 1 or n_clusters > n_words:
        raise ValueError(f"n_clusters must be in [1, {n_words}], got {n_clusters}")
    if bool((counts < 0).any()):
        raise ValueError("counts must be non-negative")
    seen = counts > 0
    n_seen = int(seen.sum())
    if 0 < n_seen < n_words:
        seen_ids, unseen_ids = seen.nonzero().squeeze(1), (~seen).nonzero().squeeze(1)
        assignment = torch.empty(n_words, dtype=torch.long)
        assignment[seen_ids] = frequency_binning(counts[seen_ids], min(n_clusters, n_seen))
        sizes = torch.bincount(assignment[seen_ids], minlength=n_clusters)
        assignment[unseen_ids] = _fill_smallest(sizes, unseen_ids.numel())
        return assignment
    total = float(counts.sum())
    order = torch.sort(counts, descending=True, stable=True).indices
    mass = (counts[order] / total).tolist() if total > 0 else [1.0 / n_words] * n_words
    assignment = torch.empty(n_words, dtype=torch.long)
    cluster, cumulative, cluster_of_rank = 0, 0.0, []
    for rank, tf in enumerate(mass):
        cumulative += tf
        cluster_of_rank.append(cluster)
        words_left = n_words - rank - 1
        clusters_left = n_clusters - cluster - 1
        # advance when this share is used up, or when every remaining cluster needs a word
        if clusters_left > 0 and (cumulative > (cluster + 1) / n_clusters or words_left <= clusters_left):
            cluster += 1
    assignment[order] = torch.tensor(cluster_of_rank, dtype=torch.long)
    return assignment


def _fill_smallest(sizes: Tensor, n_items: int) -> Tensor:
    """``[n_items]`` cluster ids: each item in turn to the cluster with the fewest words (the lowest id of a tie),
    starting from ``sizes``: the sizes end as even as the start allows."""
    heap = [(int(size), cluster) for cluster, size in enumerate(sizes.tolist())]
    heapq.heapify(heap)
    out = []
    for _ in range(n_items):
        size, cluster = heap[0]
        out.append(cluster)
        heapq.heapreplace(heap, (size + 1, cluster))
    return torch.tensor(out, dtype=torch.long)


class GreedyResult(NamedTuple):
    """Result of Algorithm 1.

    Attributes:
        assignment: ``[N]`` cluster id of every word.
        fallback_words: how many words no cluster could take under both
            constraints and went to the lightest cluster with room (small N only).
        rounds: rounds of proposals the deferred-acceptance solver took (0 from the others).
    """

    assignment: Tensor
    fallback_words: int
    rounds: int = 0


def initial_assignment(assignment: Tensor | str, n_words: int, n_clusters: int | None, counts: Tensor | None,
                       seed: int = 0) -> tuple[Tensor, int]:
    """``(assignment, n_clusters)`` a two-level softmax starts from: a given ``[N]`` tensor of cluster ids (``C``:
    its largest id + 1 unless given), or ``"random"`` (balanced, seeded by ``seed``) or ``"frequency"`` (binning by
    ``counts``, checked by the caller) into ``n_clusters`` (default ``ceil(sqrt(N))``); checked.

    Raises:
        ValueError: an unknown kind, ``n_clusters`` out of ``[1, N]``, ``"frequency"`` without counts, or an
            assignment that does not fit (:func:`check_assignment`).
    """
    if isinstance(assignment, str):
        n_clusters = default_n_clusters(n_words) if n_clusters is None else int(n_clusters)
        if not 1 <= n_clusters <= n_words:
            raise ValueError(f"n_clusters must be in [1, {n_words}], got {n_clusters}")
        if assignment == "random":
            assignment = random_assignment(n_words, n_clusters, torch.Generator().manual_seed(seed))
        elif assignment == "frequency":
            if counts is None:
                raise ValueError("assignment='frequency' needs the word counts (counts=...)")
            assignment = frequency_binning(counts, n_clusters)
        else:
            raise ValueError(f"assignment must be a tensor, 'random' or 'frequency', got {assignment!r}")
    else:
        assignment = torch.as_tensor(assignment)
        if n_clusters is None:
            n_clusters = int(assignment.max()) + 1 if assignment.numel() else 1
    return check_assignment(assignment, n_words, int(n_clusters)), int(n_clusters)


def _check_greedy_args(q: Tensor, tf: Tensor, max_size: int, freq_budget: float,
                       on_device: bool = False) -> tuple[Tensor, Tensor]:
    """Checked ``(q, tf)`` of Algorithm 1: float32 q with ``-inf`` raised to the lowest float, float64 tf,
    both on the CPU (``on_device``: on q's device)."""
    if q.dim() != 2:
        raise ValueError(f"q must have shape [N, n_clusters], got {tuple(q.shape)}")
    n_words, n_clusters = q.shape
    tf = torch.as_tensor(tf).reshape(-1)
    if tf.numel() != n_words:
        raise ValueError(f"tf must have shape [{n_words}] like q's rows, got {tuple(tf.shape)}")
    if max_size * n_clusters < n_words:
        raise ValueError(
            f"{n_clusters} clusters of at most {max_size} words cannot hold {n_words} words"
        )
    if not freq_budget > 0:
        raise ValueError(f"freq_budget must be positive, got {freq_budget}")
    q = q.detach().float()
    if not on_device:
        q = q.cpu()
    # -inf scores (e.g. from an empty cluster) must still rank above the -inf that marks closed clusters
    q = q.nan_to_num(neginf=torch.finfo(q.dtype).min)
    return q, tf.detach().to(device=q.device, dtype=torch.float64)


def tie_order(ranks: Tensor, n_clusters: int) -> Tensor:
    """``[W, C]`` int32 keys that order the clusters as the words at frequency ranks ``ranks`` (``[W]``) break ties.

    Algorithm 1's tie rule, which every solver follows: among clusters of equal ``q``, the word of
    rank ``r`` (0 = most frequent) prefers cluster ``r mod C``, then ``r + 1 mod C``, and so on. Words
    with the same row (every word not seen yet keeps q's uniform starting row) thus spread over all
    clusters in turn instead of queueing for the lowest ids, which took deferred acceptance about
    ``N / max_size`` rounds. The key is ``c`` for ``c >= r mod C`` and ``c + C`` below it (in the order of
    ``(c - r) mod C``, without an integer division per entry).
    """
    clusters = torch.arange(n_clusters, dtype=torch.int32, device=ranks.device)
    first = ranks.remainder(n_clusters).to(torch.int32)[:, None]
    return torch.where(clusters < first, clusters + n_clusters, clusters)


def best_clusters(scores: Tensor, ties: Tensor) -> Tensor:
    """``[W]``: each row's best cluster by ``scores`` (``-inf``: not a candidate), ties to the lowest ``ties``."""
    best = scores.max(dim=1, keepdim=True).values
    return torch.where(scores == best, ties, 2 * scores.shape[1]).argmin(dim=1)  # keys are below 2C


def greedy_assignment_reference(q: Tensor, tf: Tensor, max_size: int, freq_budget: float) -> GreedyResult:
    """Algorithm 1 written as the paper prints it, one word and one cluster at a time.

    Kept as the executable definition that :func:`greedy_assignment` is tested against. Ties between
    clusters follow :func:`tie_order` (the paper leaves them open).
    """
    q, tf = _check_greedy_args(q, tf, max_size, freq_budget)
    n_words, n_clusters = q.shape
    sizes = [0] * n_clusters
    masses = [0.0] * n_clusters
    assignment = [0] * n_words
    fallback = 0
    for rank, w in enumerate(torch.sort(tf, descending=True, stable=True).indices.tolist()):
        preference = torch.arange(rank, rank + n_clusters) % n_clusters  # the tie order (:func:`tie_order`)
        for c in preference[torch.sort(q[w, preference], descending=True, stable=True).indices].tolist():
            if sizes[c] < max_size and masses[c] < freq_budget:
                break
        else:  # no cluster meets both constraints: the lightest one with room
            fallback += 1
            c = min((c for c in range(n_clusters) if sizes[c] < max_size), key=lambda c: (masses[c], c))
        assignment[w] = c
        sizes[c] += 1
        masses[c] += float(tf[w])
    return GreedyResult(torch.tensor(assignment, dtype=torch.long), fallback)


def greedy_assignment(
    q: Tensor, tf: Tensor, max_size: int, freq_budget: float, block_size: int = 1024
) -> GreedyResult:
    """Algorithm 1 of Shen et al. (2017): words in descending ``tf`` take their best open cluster.

    A cluster is *open* while it holds fewer than ``max_size`` words and less than
    ``freq_budget`` of the token mass. Every word ``w`` (most frequent first) goes
    to the open cluster with the highest ``q[w, c]``; if none is open (possible when
    ``n_clusters * freq_budget < 1``), it goes to the lightest cluster that still has
    room ("fallback"). Ties between clusters follow :func:`tie_order`.

    Same result as :func:`greedy_assignment_reference`, but vectorised: a block of
    words takes its choices at once, and the block is only cut where one of its
    words would find its chosen cluster closed by an earlier word of the block, so
    the number of steps is about ``N / block_size + n_clusters``.

    Args:
        q: ``[N, n_clusters]`` cluster statistics (higher = better cluster for the word), or an
            object with ``shape`` and ``rows(words)`` (``[len(words), n_clusters]``), read a block
            of rows at a time (:class:`sohsm.heads.compact_statistics.CompactRows`). Compact statistics as the
            fold keeps them (each kept value at least the row's ``rest``) are read by their kept clusters alone,
            ``O(N M)`` instead of ``O(N C)`` (:func:`_greedy_compact`): at a million words about 2 s on one thread
            instead of tens of seconds, with the same assignment.
        tf: ``[N]`` relative term frequencies (or raw counts, scaled alike with ``freq_budget``).
        max_size: most words a cluster may hold.
        freq_budget: ``f_b``, the token mass above which a cluster takes no more words.
    """
    if isinstance(q, Tensor):
        q, tf = _check_greedy_args(q, tf, max_size, freq_budget)
        read_rows = q.__getitem__
    elif (kept := _kept_form(q)) is not None:  # compact statistics whose kept values are each row's best
        return _greedy_compact(*kept, tf, max_size, freq_budget, block_size)
    else:  # compact statistics: a block of dense rows at a time, checked as a dense q would be
        source = q
        _check_greedy_args(torch.empty(q.shape[0], q.shape[1], device="meta"), tf, max_size, freq_budget,
                           on_device=True)
        tf = torch.as_tensor(tf).reshape(-1).detach().to(device="cpu", dtype=torch.float64)

        def read_rows(words: Tensor) -> Tensor:
            return _check_greedy_args(source.rows(words), tf[words], max_size, freq_budget)[0]
    n_words, n_clusters = q.shape
    order = torch.sort(tf, descending=True, stable=True).indices
    sizes = torch.zeros(n_clusters, dtype=torch.long)
    masses = torch.zeros(n_clusters, dtype=torch.float64)
    assignment = torch.empty(n_words, dtype=torch.long)
    fallback = 0
    minus_inf = torch.tensor(float("-inf"))
    cyclic = torch.arange(n_clusters).repeat(2).unfold(0, n_clusters, 1)  # [C + 1, C]: row r is r, r + 1, ... mod C
    start = 0
    while start < n_words:
        words = order[start : start + block_size]
        # each row's columns in its word's tie order (from rank mod C on): argmax's first maximum is the rule's
        first = torch.arange(start, start + words.numel()).remainder(n_clusters)  # [n]
        turn = cyclic[first]  # [n, C]: row i is first[i], first[i] + 1, ... mod C
        scores = read_rows(words).gather(1, turn)  # [n, C]
        word_tf = tf[words]
        while words.numel():
            closed = (sizes >= max_size) | (masses >= freq_budget)
            if bool(closed.all()):
                _place_in_lightest(int(words[0]), tf, sizes, masses, max_size, assignment)
                fallback += 1
                words, scores, word_tf, first, turn = words[1:], scores[1:], word_tf[1:], first[1:], turn[1:]
                continue
            closed_in_turn = torch.cat([closed, closed]).unfold(0, n_clusters, 1)[first]  # [n, C], as scores
            choice = turn.gather(1, torch.where(closed_in_turn, minus_inf, scores).argmax(dim=1, keepdim=True))
            choice = choice.squeeze(1)  # [n]
            cut = _first_blocked(choice, word_tf, sizes, masses, max_size, freq_budget)
            taken = choice[:cut]
            assignment[words[:cut]] = taken
            sizes += torch.bincount(taken, minlength=n_clusters)
            masses.index_add_(0, taken, word_tf[:cut])
            words, scores, word_tf, first, turn = words[cut:], scores[cut:], word_tf[cut:], first[cut:], turn[cut:]
        start += block_size
    return GreedyResult(assignment, fallback)


def _first_blocked(choice: Tensor, word_tf: Tensor, sizes: Tensor, masses: Tensor, max_size: int,
                   freq_budget: float) -> int:
    """How many of a block's words take their ``choice`` before one finds its cluster closed by the words before it
    (its size reached ``max_size``, or its mass ``freq_budget``): the index of the first such word, else all.

    A word's place among the block's words of its cluster is found by a stable sort (``n log n``, not ``n x C``);
    the masses are summed, in the reference's order, only for the clusters the whole block could bring near the
    budget (the rest stay below it whatever the order of the sum: every ``tf`` is non-negative)."""
    n = choice.numel()
    order = torch.sort(choice, stable=True).indices
    sorted_choice = choice[order]
    position = torch.arange(n)
    starts = torch.ones(n, dtype=torch.bool)
    starts[1:] = sorted_choice[1:] != sorted_choice[:-1]
    group_start = torch.cummax(torch.where(starts, position, 0), dim=0).values
    before_count = torch.empty(n, dtype=torch.long)
    before_count[order] = position - group_start
    blocked = sizes[choice] + before_count >= max_size
    total = masses.index_add(0, choice, word_tf)  # every word of the block in: the most a cluster can reach
    near = total >= freq_budget * (1 - 1e-9)
    if bool(near[choice].any()):
        columns = torch.nonzero(near).squeeze(1)  # the clusters that may reach the budget, summed as the reference
        local = torch.searchsorted(columns, choice)
        mine = near[choice]
        one_hot = torch.zeros(n, columns.numel(), dtype=torch.float64)
        one_hot[mine, local[mine]] = 1.0
        running = torch.cat([masses[columns][None], one_hot * word_tf[:, None]]).cumsum(0)[:-1]
        before_mass = running.gather(1, local.clamp(max=columns.numel() - 1)[:, None]).squeeze(1)
        blocked |= mine & (before_mass >= freq_budget)
    return int(blocked.long().argmax()) if bool(blocked.any()) else n


def _kept_form(q) -> tuple[Tensor, Tensor, Tensor, int] | None:
    """``(index, values, rest, C)`` of compact statistics (:class:`~sohsm.heads.two_level.self_organizing.
    compact_statistics.CompactRows`) checked as a dense ``q`` is, where every kept value is at least its row's
    ``rest`` (as the fold keeps them) and some cluster is not kept; else ``None`` (read as dense rows)."""
    index, values, rest = (getattr(q, name, None) for name in ("index", "values", "rest"))
    if not (isinstance(index, Tensor) and isinstance(values, Tensor) and isinstance(rest, Tensor)
            and index.shape[1] < q.shape[1]):
        return None
    lowest = torch.finfo(torch.float32).min
    values = values.detach().float().cpu().nan_to_num(neginf=lowest)
    rest = rest.detach().float().cpu().nan_to_num(neginf=lowest)
    if index.numel() and not bool((values >= rest[:, None]).all()):
        return None
    return index.detach().cpu().long(), values, rest, int(q.shape[1])


def _place_in_lightest(w: int, tf: Tensor, sizes: Tensor, masses: Tensor, max_size: int, assignment: Tensor) -> None:
    """Algorithm 1's fallback where every cluster is closed: word ``w`` goes to the lightest cluster with room."""
    room = torch.where(sizes < max_size, masses, torch.tensor(float("inf"), dtype=torch.float64))
    c = int(room.argmin())
    assignment[w] = c
    sizes[c] += 1
    masses[c] += tf[w]


def _greedy_compact(index: Tensor, values: Tensor, rest: Tensor, n_clusters: int, tf: Tensor, max_size: int,
                    freq_budget: float, block_size: int) -> GreedyResult:
    """:func:`greedy_assignment` of compact statistics, reading each word's ``M`` kept clusters and not its ``C``.

    Every cluster not kept has the row's ``rest``, at most any kept value. So a word's best open cluster is its best
    open kept one where that beats ``rest``; otherwise every open cluster ties at ``rest`` and the tie order decides:
    the first open cluster from ``rank mod C`` on. The same assignment as the dense rows give (tested), in
    ``O(N (M + log N) + C)`` per pass of a block instead of ``O(N C)``.
    """
    n_words = index.shape[0]
    _check_greedy_args(torch.empty(n_words, n_clusters, device="meta"), tf, max_size, freq_budget, on_device=True)
    tf = torch.as_tensor(tf).reshape(-1).detach().to(device="cpu", dtype=torch.float64)
    order = torch.sort(tf, descending=True, stable=True).indices
    sizes = torch.zeros(n_clusters, dtype=torch.long)
    masses = torch.zeros(n_clusters, dtype=torch.float64)
    assignment = torch.empty(n_words, dtype=torch.long)
    fallback = 0
    minus_inf = torch.tensor(float("-inf"))
    twice = torch.arange(2 * n_clusters)
    start = 0
    while start < n_words:
        words = order[start : start + block_size]
        first = torch.arange(start, start + words.numel()).remainder(n_clusters)  # [n]: where each tie order starts
        kept, kept_values, word_rest = index[words], values[words], rest[words]  # [n, M], [n, M], [n]
        distance = (kept - first[:, None]).remainder(n_clusters)  # [n, M]: place in the word's tie order
        word_tf = tf[words]
        while words.numel():
            closed = (sizes >= max_size) | (masses >= freq_budget)
            if bool(closed.all()):
                _place_in_lightest(int(words[0]), tf, sizes, masses, max_size, assignment)
                fallback += 1
                words, kept, kept_values, word_rest = words[1:], kept[1:], kept_values[1:], word_rest[1:]
                distance, word_tf, first = distance[1:], word_tf[1:], first[1:]
                continue
            open_values = torch.where(closed[kept], minus_inf, kept_values)  # [n, M]
            best = open_values.max(dim=1, keepdim=True).values
            tied = torch.where(open_values == best, distance, 2 * n_clusters)
            best_kept = kept.gather(1, tied.argmin(dim=1, keepdim=True)).squeeze(1)
            # the first open cluster from each place of the tie order on (cyclically): a reverse running minimum
            open_at = torch.where(torch.cat([~closed, ~closed]), twice, 2 * n_clusters)
            next_open = open_at.flip(0).cummin(0).values.flip(0)[:n_clusters].remainder(n_clusters)
            choice = torch.where(best.squeeze(1) > word_rest, best_kept, next_open[first])
            cut = _first_blocked(choice, word_tf, sizes, masses, max_size, freq_budget)
            taken = choice[:cut]
            assignment[words[:cut]] = taken
            sizes += torch.bincount(taken, minlength=n_clusters)
            masses.index_add_(0, taken, word_tf[:cut])
            words, kept, kept_values, word_rest = words[cut:], kept[cut:], kept_values[cut:], word_rest[cut:]
            distance, word_tf, first = distance[cut:], word_tf[cut:], first[cut:]
        start += block_size
    return GreedyResult(assignment, fallback)
