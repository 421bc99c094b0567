"""Run a function in several processes joined by a gloo process group (CPU), for the DDP tests.

Workers live in this module (not in a test file) so that spawned processes import them cheaply.
"""
from __future__ import annotations

import datetime
import os

import torch
import torch.distributed as dist

from sohsm.clustering.trees import random_tree, save_tree
from sohsm.heads import build_head

D, N = 8, 100


def spawn(worker, tmp_path, *args, world_size: int = 2) -> list:
    """``worker(rank, world_size, *args)`` in ``world_size`` processes; the list of what each returned."""
    torch.multiprocessing.spawn(_main, args=(worker, world_size, str(tmp_path), args), nprocs=world_size)
    return [torch.load(tmp_path / f"result{rank}.pt", weights_only=False) for rank in range(world_size)]


def _main(rank: int, worker, world_size: int, folder: str, args: tuple) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{folder}/rendezvous", rank=rank,
                            world_size=world_size, timeout=datetime.timedelta(seconds=60))
    try:
        torch.save(worker(rank, world_size, *args), os.path.join(folder, f"result{rank}.pt"))
    finally:
        dist.destroy_process_group()


def make_head(name: str, folder: str, **options):
    """Head ``name`` at the DDP tests' sizes, the same on every rank (a tree file for ``tree_file``)."""
    if name == "tree_file":
        path = os.path.join(folder, "tree.pt")
        if not os.path.exists(path):  # both ranks may get here: write privately, then rename (atomic),
            private = f"{path}.{os.getpid()}"  # so that no rank reads a file another is still writing
            save_tree(private, random_tree(N, torch.Generator().manual_seed(0)))
            os.replace(private, path)
        options = {"path": path, **options}
    if name == "adaptive":
        options = {"div_value": 2.0, **options}
    if name == "self_organized":
        options = {"update_every": 0, **options}
    torch.manual_seed(0)
    return build_head(name, D, N, counts=torch.arange(N, 0, -1) * 5, **options)


def _dense(grad):
    return None if grad is None else (grad.to_dense() if grad.is_sparse else grad)


def ddp_gradient_errors(rank: int, world_size: int, names: list[str], variants: list[dict], folder: str,
                        steps: int = 4, rows: int = 3) -> dict:
    """For each head and DDP setting: the largest difference, over ``steps`` SGD steps, between the
    gradients under DDP (``rows`` rows per rank) and those of one process on the union batch; and
    (to spare a second spawn) the error a ZeroRedundancyOptimizer gets from ``attach``."""
    errors = {}
    for name in names:
        for i, variant in enumerate(variants):
            variant = dict(variant)
            set_to_none = variant.pop("set_to_none")
            head, reference = make_head(name, folder), make_head(name, folder)
            model = torch.nn.parallel.DistributedDataParallel(head, find_unused_parameters=head.skips_parameters,
                                                              **variant)
            optimizer = torch.optim.SGD(head.parameters(), lr=0.5)
            ref_optimizer = torch.optim.SGD(reference.parameters(), lr=0.5)
            generator = torch.Generator().manual_seed(7)
            error = 0.0
            for _ in range(steps):
                hidden = torch.randn(world_size * rows, D, generator=generator)
                target = torch.randint(0, N, (world_size * rows,), generator=generator)
                reference(hidden, target).loss.backward()
                share = slice(rank * rows, (rank + 1) * rows)
                model(hidden[share], target[share]).loss.backward()
                for p, r in zip(head.parameters(), reference.parameters()):
                    g, g_ref = _dense(p.grad), _dense(r.grad)
                    if g is None or g_ref is None:
                        error = max(error, float("inf") if (g is None) != (g_ref is None) else 0.0)
                    else:
                        error = max(error, float((g - g_ref).abs().max()))
                optimizer.step()
                ref_optimizer.step()
                optimizer.zero_grad(set_to_none=set_to_none)
                ref_optimizer.zero_grad(set_to_none=set_to_none)
            errors[f"{name} {i}"] = error
    return {"errors": errors, "zero": zero_refusal(rank, world_size)}


def zero_refusal(rank: int, world_size: int) -> str:
    """The error ``attach`` gives for a ZeroRedundancyOptimizer."""
    from torch.distributed.optim import ZeroRedundancyOptimizer

    head = build_head("self_organized", D, N, update_every=2)
    optimizer = ZeroRedundancyOptimizer(head.parameters(), optimizer_class=torch.optim.Adagrad, lr=0.1)
    try:
        head.attach(optimizer)
    except ValueError as error:
        return str(error)
    return ""


def _so_state(head, optimizer) -> dict:
    """What a re-clustering must keep equal: assignment, q, counts, word vectors and Adagrad sums in word order."""
    slot = head._layout.slot_of_word
    return {
        "assignment": head.assignment.clone(),
        "q": head.q.clone() if head.reclustering.q_clusters is None else head.statistics_rows().dense(),
        "counts": head.counts.clone(),
        "word_vectors": head.weight.detach()[slot].clone(),
        "sums": optimizer.state[head.weight]["sum"][slot].clone(),
        "history": [{k: v for k, v in r.items()} for r in head.history], "tokens_seen": head.tokens_seen,
    }


def ddp_reclustering(rank: int, world_size: int, counts_given: bool, q_clusters: int | None = None, steps: int = 4,
                     rows: int = 24) -> dict:
    """A self-organized head re-clustering every 2 steps, under DDP (``rows`` rows per rank) and, as
    the reference, in one process on the union batches (the ranks' shares concatenated in rank order);
    ``q_clusters``: the head's option, q kept compact."""
    counts = torch.arange(N, 0, -1) * 5 if counts_given else None
    heads = []
    for _ in range(2):
        torch.manual_seed(0)
        heads.append(build_head("self_organized", D, N, counts=counts, update_every=2, n_clusters=8, gamma=2.0,
                                 q_clusters=q_clusters))
    head, reference = heads
    # rank 1 starts from other clusters and weights: DDP's broadcast at construction must fix both
    if rank == 1:
        with torch.no_grad():
            head.weight.normal_()
            head.set_assignment(head.assignment.roll(1))
    model = torch.nn.parallel.DistributedDataParallel(head)
    optimizers = [torch.optim.Adagrad(h.parameters(), lr=0.5) for h in (head, reference)]
    for h, optimizer in zip((head, reference), optimizers):
        h.attach(optimizer)
    generator = torch.Generator().manual_seed(3)
    for _ in range(steps):
        hidden = torch.randn(world_size * rows, D, generator=generator)
        target = torch.randint(0, N // 2, (world_size * rows,), generator=generator) ** 2 % N  # skewed
        share = slice(rank * rows, (rank + 1) * rows)
        for m, _h, optimizer, (x, t) in ((model, head, optimizers[0], (hidden[share], target[share])),
                                        (reference, reference, optimizers[1], (hidden, target))):
            m(x, t).loss.backward()
            optimizer.step()
            optimizer.zero_grad()
    return {"ddp": _so_state(head, optimizers[0]), "one_process": _so_state(reference, optimizers[1])}
