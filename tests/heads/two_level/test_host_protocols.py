"""The two-level heads' parts own their state: the mixins read only what the head kind they are mixed into has and
what their ``TYPE_CHECKING`` block declares of the head, no attribute appears on a head after its constructor, and
the statistics and the schedule work on tensors alone."""
from __future__ import annotations

import ast
import copy
import inspect
import math
import textwrap

import pytest
import torch

from sohsm.heads import Reclustering, SelfOrganizedSoftmax, TwoLevelSoftmax
from sohsm.heads.base import ClusteredHead, SelfOrganizingHead
from sohsm.heads.two_level import backend_choice, scoring, tied_words
from sohsm.heads.two_level.self_organizing import head_statistics
from sohsm.heads.two_level.self_organizing.cluster_statistics import ClusterStatistics
from sohsm.heads.two_level.self_organizing.recluster_schedule import PAPER_K, ReclusterSchedule

N, D = 40, 8
#: each mixin, with the head kind it is mixed into (its base for the checker)
MIXINS = [(scoring, "TwoLevelScoring", ClusteredHead), (head_statistics, "HeadStatistics", SelfOrganizingHead),
          (backend_choice, "BackendChoice", ClusteredHead), (tied_words, "TiedWords", ClusteredHead)]


def _class(module, mixin: str) -> ast.ClassDef:
    tree = ast.parse(inspect.getsource(module))
    return next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == mixin)


def _names(body) -> set[str]:
    """The names a class body's statements define: methods, annotated and assigned attributes."""
    names = {n.name for n in body if isinstance(n, ast.FunctionDef)}
    names |= {n.target.id for n in body if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)}
    return names | {t.id for n in body if isinstance(n, ast.Assign) for t in n.targets if isinstance(t, ast.Name)}


def _checking_block(cls: ast.ClassDef) -> set[str]:
    """What a class body's ``if TYPE_CHECKING:`` block declares (nothing where it has none)."""
    return set().union(*(_names(n.body) for n in cls.body
                         if isinstance(n, ast.If) and isinstance(n.test, ast.Name) and n.test.id == "TYPE_CHECKING"))


def _declared(module, mixin: str) -> set[str]:
    """What the mixin's in-class ``if TYPE_CHECKING:`` block declares of the head."""
    return _checking_block(_class(module, mixin))


def _kind_members(kind: type) -> set[str]:
    """What every head of ``kind`` has: its classes' members, annotations and ``TYPE_CHECKING`` declarations, and
    what their constructors set on ``self``."""
    members = set(dir(kind))
    for cls in kind.__mro__:
        members |= set(vars(cls).get("__annotations__", {}))
        if not cls.__module__.startswith("sohsm"):
            continue
        tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
        members |= _checking_block(tree.body[0])
        for init in (n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == "__init__"):
            members |= {t.attr for n in ast.walk(init) if isinstance(n, (ast.Assign, ast.AnnAssign))
                        for t in (n.targets if isinstance(n, ast.Assign) else [n.target])
                        if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "self"}
    return members


@pytest.mark.parametrize(("module", "mixin", "kind"), MIXINS)
def test_a_mixin_reads_only_its_head_kind_and_what_it_declares(module, mixin, kind):
    cls = _class(module, mixin)
    own = _names(cls.body)
    read = {n.attr for n in ast.walk(cls)
            if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and n.value.id == "self"}
    assert read, mixin
    assert read - own - _declared(module, mixin) - _kind_members(kind) == set()


def test_the_host_check_catches_a_member_no_one_declares():
    """The check above can fail: a name neither the kind nor a block has is not among what they allow."""
    allowed = _declared(tied_words, "TiedWords") | _kind_members(ClusteredHead)
    assert "words" in allowed and "in_features" in allowed
    assert "_layout_cache" not in allowed and "statistics" not in allowed


def _heads():
    counts = torch.randint(1, 50, (N,), generator=torch.Generator().manual_seed(0)).double()
    return {
        "two_level": TwoLevelSoftmax(D, N, counts=counts, div_value=2.0),
        "self_organized": SelfOrganizedSoftmax(D, N, counts=counts, reclustering=Reclustering(update_every=2)),
    }


@pytest.mark.parametrize(("module", "mixin", "kind"), MIXINS)
def test_the_heads_have_what_the_mixins_declare(module, mixin, kind):
    for name, head in _heads().items():
        if isinstance(head, getattr(module, mixin)):
            assert isinstance(head, kind), name
            missing = [a for a in _declared(module, mixin) if not hasattr(head, a)]
            assert missing == [], (name, missing)


@pytest.mark.parametrize("backend", ["per_cluster", "grouped_torch"])
@pytest.mark.parametrize("kind", ["two_level", "self_organized"])
def test_every_attribute_is_set_in_the_constructor(kind, backend):
    """Training, re-clustering, a static step, ``.double()`` and a load add no attribute to the head: its parts
    keep their own state (none through ``head.__dict__``)."""
    head = _heads()[kind]
    head.backend = backend
    before = set(vars(head))
    optimizer = torch.optim.Adagrad(head.parameters(), lr=0.1)
    head.attach(optimizer)
    g = torch.Generator().manual_seed(1)
    for static in (False, True, False):
        head.set_static(static)
        for _ in range(3):
            head(torch.randn(16, D, generator=g), torch.randint(0, N, (16,), generator=g)).loss.backward()
            optimizer.step()
            optimizer.zero_grad()
    head.topk(torch.randn(4, D), 3)
    head.load_state_dict(head.state_dict())
    head.double()
    assert set(vars(head)) == before
    if kind == "self_organized":
        assert head.history and head.tokens_seen == 9 * 16


def test_the_statistics_fold_on_the_host_and_on_the_device_alike_from_tensors_alone():
    g = torch.Generator().manual_seed(2)
    start = -math.log2(6)
    host, device = (ClusterStatistics(N, 5, 1, start, "epoch", None, counts_given=False) for _ in range(2))
    host_counts, device_counts = torch.zeros(N, dtype=torch.long), torch.zeros(N, dtype=torch.long)
    for _ in range(3):
        target = torch.randint(0, 10, (25,), generator=g)
        log_probs = torch.log_softmax(torch.randn(25, 6, generator=g, dtype=torch.float64), dim=1).float()
        host.fold(target, log_probs, host_counts)
        device.wait(target, log_probs, device_counts)  # counting targets: folded at once, never waiting
    assert not device.waiting.batches and torch.equal(host_counts, device_counts)
    assert int(host_counts.sum()) == 75 and host.dense.shape == (N, 5)
    torch.testing.assert_close(device.dense, host.dense, rtol=1e-5, atol=1e-5)
    assert not torch.equal(host.dense, torch.full((N, 5), start))


def test_the_schedule_decides_from_its_own_state():
    schedule = ReclusterSchedule(Reclustering(first_update=5, update_every=3, freeze_after_tokens=100))
    assert [step for step in range(1, 15) if schedule.due(step) == "reassign"] == [5, 8, 11, 14]
    schedule.saw(100, None)
    assert schedule.due(6) == "freeze"
    schedule.frozen = True
    assert schedule.due(8) is None
    auto = ReclusterSchedule(Reclustering(reclusters_per_epoch=4))
    counts = torch.full((N,), 50)  # an epoch of 2,000 tokens
    assert auto.describe(100, counts) == "K 5 (auto, ≈4 per epoch)" and auto.update_every is None
    auto.saw_later(100)
    auto.settle(counts)
    assert (auto.update_every, auto.tokens_seen) == (5, 100)
    uncounted = ReclusterSchedule(Reclustering())
    uncounted.saw(100, None)
    assert uncounted.update_every == PAPER_K
    steps = torch.zeros((), dtype=torch.long)
    assert [schedule.count_step(steps) for _ in range(3)] == [1, 2, 3] and int(steps) == 3


def test_the_state_dict_keeps_the_keys_of_one_module():
    """Checkpoints keep loading: the parts' state is saved under the head's keys, as before they owned it."""
    counts = torch.randint(1, 50, (N,), generator=torch.Generator().manual_seed(0)).double()
    plain = SelfOrganizedSoftmax(D, N, counts=counts)
    assert set(plain.state_dict()) == {"cluster_weight", "weight", "assignment", "counts", "steps", "_extra_state",
                                       "q"}
    assert set(plain.state_dict()["_extra_state"]) == {"history", "counts_given", "update_every", "tokens_seen",
                                                       "frozen"}
    banded = SelfOrganizedSoftmax(D, N, counts=counts, div_value=2.0, cutoffs=[10],
                                  reclustering=Reclustering(q_clusters=2))
    assert set(banded.state_dict()) == {"cluster_weight", "band_of_word", "assignment", "counts", "steps",
                                        "_extra_state", "q_index", "q_values", "q_rest", "band_projections.0.weight",
                                        "band_weights.0", "band_weights.1"}
    assert [name for name, _ in banded.named_parameters()] == ["cluster_weight", "band_projections.0.weight",
                                                               "band_weights.0", "band_weights.1"]


@pytest.mark.parametrize("assign", [False, True])
def test_a_load_binds_the_word_vectors_to_the_heads_parameters(assign):
    """``load_state_dict(assign=True)`` puts new tensors in the head: its word vectors follow them."""
    head = _heads()["two_level"]
    other = copy.deepcopy(head)
    with torch.no_grad():
        for weight in other.band_weights:
            weight.add_(1.0)
    head.load_state_dict(other.state_dict(), assign=assign)
    assert [id(w) for w in head.words.weights] == [id(w) for w in head.band_weights]
    assert head.words.band_of_word is head.band_of_word
    head(torch.randn(8, D), torch.randint(0, N, (8,))).loss.backward()
    assert all(w.grad is not None for w in head.band_weights)
    torch.testing.assert_close(head.word_vectors(), other.word_vectors(), rtol=0, atol=0)
