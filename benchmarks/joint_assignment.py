"""Algorithm 1 with the in-cluster term: does weighing both factors of P(w | h) close the gap to frequency bins?

Algorithm 1 places each word ``w`` in the open cluster with the highest ``q(w, c) = E[log2 P(c | h) | w]``: the
cluster factor alone. On the small transformer frequency binning beats it (docs/results/transformer.md): the learned
clusters are easier to predict but their words harder to tell apart. The joint criterion scores a cluster by both
factors the word would have there,

    q(w, c) + beta * E[log2 P(w | c, h) | w],   P(w | c, h) = exp(s_w) / (exp(s_w) + sum_{w' in c, w' != w} exp(s_w'))

with ``E`` a mean over the word's training tokens that were scored against every word (``sample x N x d``
multiply-adds). ``--mode ordered`` (the default) keeps the last ``--sample`` training tokens and, while Algorithm 1
places the words (most frequent first, the same size and mass limits), takes each word's in-cluster term against the
words already placed in the new clusters; ``--mode separable`` scores ``--sample`` tokens of every batch against the
clusters as they are and adds the per-word means to ``q``. ``--margin M`` (ordered) adds ``M`` bits to a word's own
cluster, so that it moves only for a clear gain. A word without a scored token keeps ``q`` alone;
``beta = 0`` is the paper's Algorithm 1. The head is ``self_organized`` otherwise (every option and default),
registered here as ``self_organized_joint`` for this experiment only (one process, dense ``q``). Measured:
neither mode beat Algorithm 1 (docs/results/transformer.md).

Usage (the transformer protocol of benchmarks/fair_quality.py, PTB, one epoch, tied; prints the best dev perplexity
and its two factors; run again to resume)::

    python benchmarks/joint_assignment.py --run-dir runs/joint/ordered --beta 1 --seed 1
    python benchmarks/joint_assignment.py --run-dir runs/joint/separable --beta 1 --mode separable --sample 1024
"""
from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor

from sohsm.heads import Reclustering, SelfOrganizedSoftmax
from sohsm.heads.registry import register_head
from sohsm.tasks.lm import LMConfig
from sohsm.train import resume_training, train

LN2 = math.log(2.0)


class JointSelfOrganizedSoftmax(SelfOrganizedSoftmax):
    """The self-organized head whose re-clustering weighs the in-cluster factor too (module docstring).

    ``mode="separable"`` adds to ``q(w, c)`` the in-cluster term that ``w`` would have in cluster ``c`` as the clusters
    are *now*, averaged over ``sample`` tokens of each batch; ``mode="ordered"`` (the default) keeps the last
    ``sample`` training tokens and, while Algorithm 1 places the words (most frequent first), scores each word's
    in-cluster term against the words already placed in the *new* clusters.
    """

    def __init__(self, in_features: int, n_classes: int, counts: Tensor | None = None, beta: float = 1.0,
                 sample: int = 4096, mode: str = "ordered", margin: float = 0.0, **options) -> None:
        options = dict(options)  # the self-organized head's options, the re-clustering ones flat or as their group
        reclustering = options.pop("reclustering", None) or Reclustering.take(options)
        super().__init__(in_features, n_classes, counts=counts, reclustering=reclustering, **options)
        if self.reclustering.q_clusters is not None:
            raise ValueError("the joint criterion is written for the dense q (q_clusters=None)")
        if mode not in ("ordered", "separable"):
            raise ValueError(f"mode must be 'ordered' or 'separable', got {mode!r}")
        self.beta, self.sample, self.mode, self.margin = float(beta), int(sample), mode, float(margin)
        learned = self.n_clusters - self.shortlist
        self.joint_sum = torch.zeros(n_classes, learned, dtype=torch.float64)
        self.joint_count = torch.zeros(n_classes, dtype=torch.float64)
        self.kept: list[tuple[Tensor, Tensor]] = []  # ordered: the last training tokens (hidden_w, target)

    def forward(self, hidden: Tensor, target: Tensor):
        out = super().forward(hidden, target)
        if self.training and self.beta and not self.frozen:
            hidden, target = hidden.detach().reshape(-1, hidden.size(-1)), target.reshape(-1)
            if self.mode == "separable":
                self._observe_in_cluster(hidden, target)
            else:
                keep = torch.randperm(target.numel(), device=target.device)[: self.sample]
                self.kept.append((self._split_hidden(hidden[keep])[1].float(), target[keep]))
                while sum(t.numel() for _, t in self.kept) - self.kept[0][1].numel() >= self.sample:
                    self.kept.pop(0)
        return out

    @torch.no_grad()
    def _observe_in_cluster(self, hidden: Tensor, target: Tensor) -> None:
        """Add ``log2 P(t | c, h)`` for every learned cluster ``c`` (``t`` moved there) of a sample of the batch."""
        keep = torch.randperm(target.numel(), device=target.device)[: self.sample]
        hidden, target = hidden[keep], target[keep]
        _, hidden_w = self._split_hidden(hidden)
        layout = self._layout
        logits = F.linear(hidden_w, self.weight).double()  # [m, N], slot order
        index = layout.cluster_of_slot.expand_as(logits)
        shape = (logits.size(0), self.n_clusters)
        peak = logits.new_full(shape, float("-inf")).scatter_reduce(1, index, logits, "amax").nan_to_num(neginf=0.0)
        sums = logits.new_zeros(shape).scatter_add(1, index, (logits - peak.gather(1, index)).exp())
        log_z = sums.log() + peak  # [m, C] log-sum-exp of each cluster's scores; -inf for an empty one
        own = logits.gather(1, layout.slot_of_word[target][:, None])  # [m, 1] s_t
        joined = own - torch.logaddexp(log_z, own)  # t added to cluster c
        home = self.assignment[target][:, None]
        joined.scatter_(1, home, own - log_z.gather(1, home))  # t's own cluster already holds it
        self.joint_sum.index_add_(0, target.cpu(), (joined[:, self.shortlist:] / LN2).cpu())
        self.joint_count.index_add_(0, target.cpu(), torch.ones(target.numel(), dtype=torch.float64))

    @torch.no_grad()
    def reassign(self, optimizer=None) -> dict:
        if self.mode == "ordered":
            return self._reassign_ordered(optimizer)
        seen = self.joint_count > 0
        paper_q = self.q
        if self.beta and bool(seen.any()):
            joint = paper_q.clone()
            joint[seen] += (self.beta * self.joint_sum[seen] / self.joint_count[seen, None]).to(joint.dtype)
            self.q = joint
        try:
            record = super().reassign(optimizer)
        finally:
            self.q = paper_q
        record["joint_words"] = int(seen.sum())
        self.joint_sum.zero_()
        self.joint_count.zero_()  # the estimates were for the clusters that just changed
        return record

    @torch.no_grad()
    def _reassign_ordered(self, optimizer=None) -> dict:
        """Algorithm 1, most frequent word first, each word to its open cluster of highest
        ``q(w, c) + beta * mean log2 P(w | c, h)`` over its kept tokens, against the words placed so far."""
        if not self.kept or not self.beta:
            return super().reassign(optimizer)
        hidden = torch.cat([h for h, _ in self.kept])[-self.sample:]
        target = torch.cat([t for _, t in self.kept])[-self.sample:]
        self.kept.clear()
        layout = self._layout
        scores = F.linear(hidden, self.weight.float())[:, layout.slot_of_word]  # [R, N] in word order
        scores = (scores - scores.max(dim=1, keepdim=True).values).double().exp()  # a row's scale cancels out
        counts = self.counts.to(torch.float64)
        tf = counts / counts.sum() if bool(counts.sum() > 0) else torch.full_like(counts, 1.0 / self.n_classes)
        s = self.shortlist
        learned = self.n_clusters - s
        words = self.tail_words if s else torch.arange(self.n_classes)
        order = words[torch.sort(tf[words], descending=True, stable=True).indices]
        rows_of = {}
        sorted_t, by = torch.sort(target.cpu(), stable=True)
        uniq, n_of = torch.unique_consecutive(sorted_t, return_counts=True)
        for w, rows in zip(uniq.tolist(), torch.split(by, n_of.tolist())):
            rows_of[w] = rows
        z = torch.zeros(scores.size(0), learned, dtype=torch.float64)  # each kept token's sum over a new cluster
        sizes = torch.zeros(learned, dtype=torch.long)
        masses = torch.zeros(learned, dtype=torch.float64)
        new = self.assignment.clone()
        q = self.q.double()
        fallback = 0
        for rank, w in enumerate(order.tolist()):
            joint = q[w].clone()
            rows = rows_of.get(w)
            if rows is not None:
                own = scores[rows, w][:, None]
                joint += self.beta * (own / (z[rows] + own)).log2().mean(0)
            home = int(self.assignment[w]) - s
            if self.margin and home >= 0 and self.history:  # a word leaves its cluster for a clear gain only (not
                # from the random start)
                joint[home] += self.margin
            closed = (sizes >= self.max_cluster_size) | (masses >= self.reclustering.freq_budget)
            if bool(closed.all()):
                fallback += 1
                c = int(torch.where(sizes < self.max_cluster_size, masses, float("inf")).argmin())
            else:
                turn = torch.roll(torch.arange(learned), -(rank % learned))  # the tie rule: rank mod C first
                ranked = torch.where(closed, float("-inf"), joint)[turn]
                c = int(turn[int(ranked.argmax())])
            new[w] = c + s
            sizes[c] += 1
            masses[c] += tf[w]
            z[:, c] += scores[:, w]
        new = new.to(self.assignment.device)
        moved = self._move_words(new, new != self.assignment, optimizer)
        self._sync_free_width()
        moved_tf = float(torch.where(moved.cpu(), tf, 0.0).sum())
        record = {"step": int(self.steps), "change_rate": float(moved.double().mean()), "moved_tf_mass": moved_tf,
                  "empty_clusters": int((self._layout.sizes_t == 0).sum()), "fallback_words": fallback,
                  "joint_words": len(rows_of)}
        self.history.append(record)
        return record


def _self_organized_joint(in_features: int, n_classes: int, counts=None, **options) -> JointSelfOrganizedSoftmax:
    return JointSelfOrganizedSoftmax(in_features, n_classes, counts=counts, **options)


#: the transformer protocol of benchmarks/fair_quality.py (PTB, the small model, one epoch, tied)
PROTOCOL = {"data.corpus": "ptb", "model.architecture": "transformer", "model.layers": 4, "model.hidden_size": 256,
            "model.attention_heads": 4, "bptt": 128, "batch_size": 32, "epochs": 1, "model.tie_weights": True,
            "checkpoint_every": 200}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--run-dir", type=Path, required=True)
    parser.add_argument("--beta", type=float, default=1.0, help="weight of the in-cluster term (0: Algorithm 1)")
    parser.add_argument("--sample", type=int, default=4096, help="ordered: training tokens kept for the estimate; "
                        "separable: tokens of each batch scored against every word")
    parser.add_argument("--mode", choices=("ordered", "separable"), default="ordered")
    parser.add_argument("--margin", type=float, default=0.0, help="ordered: bits by which another cluster must beat "
                        "a word's own for it to move")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--option", action="append", default=[], metavar="KEY=VALUE",
                        help="another self_organized option (e.g. init=frequency)")
    args = parser.parse_args(argv)
    # registered here, not at import: importing this module (the tests do) leaves sohsm's heads as they are
    register_head("self_organized_joint", builds=JointSelfOrganizedSoftmax)(_self_organized_joint)
    options = {"beta": args.beta, "sample": args.sample, "mode": args.mode, "margin": args.margin}
    for item in args.option:
        key, value = item.split("=", 1)
        options[key] = json.loads(value) if value[:1].isdigit() or value in ("true", "false") else value
    if (args.run_dir / "last.pt").exists():
        resume_training(args.run_dir, progress=False)
    else:
        config = LMConfig.from_overrides({**PROTOCOL, "seed": args.seed, "head.name": "self_organized_joint",
                                          "head.options": options})
        train(config, args.run_dir, progress=False)
    records = [json.loads(line) for line in (args.run_dir / "metrics.jsonl").read_text().splitlines() if line]
    best = min((r for r in records if r["kind"] == "eval"), key=lambda r: r["ppl"])
    print(f"{args.run_dir.name}: best dev ppl {best['ppl']:.2f} (cluster {best['ppl_cluster']:.2f}, in-cluster "
          f"{best['ppl_in_cluster']:.2f})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
