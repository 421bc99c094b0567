"""How large a word vector's gradient is as an input embedding and as an output vector, in the first steps.

A tied weight sums both into one gradient and one Adagrad accumulator, so whichever role is larger sets
the step both take. This trains the untied model (LSTM 512, the self-organized head, Adagrad 0.1, clipping
0.25, batch 128 x BPTT 20 on Penn Treebank from your data directory) and prints, step by step, the median
row norm of the embedding's gradient over the words in the batch and of the head's word vectors' gradient
over the rows that get one. Usage::

    OMP_NUM_THREADS=1 python benchmarks/gradient_roles.py --warmup 30 --steps 40
    OMP_NUM_THREADS=1 python benchmarks/gradient_roles.py --warmup 0 --steps 10     # without the warm-up
"""
from __future__ import annotations

import argparse
import collections
import os
from pathlib import Path

import torch

from sohsm import SelfOrganizedSoftmax


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--warmup", type=int, default=30, help="steps of the linear warm-up (0: none)")
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--data-dir", type=Path,
                        default=Path(os.environ.get("SOHSM_DATA", "~/.cache/sohsm")).expanduser())
    args = parser.parse_args()
    torch.manual_seed(1)
    words = (args.data_dir / "ptb" / "ptb.train.txt").read_text().replace("\n", " <eos> ").split()
    ranked = collections.Counter(words).most_common()
    vocab = {w: i for i, (w, _) in enumerate(ranked)}
    n, d, batch, bptt = len(vocab), 512, 128, 20
    columns = torch.tensor([vocab[w] for w in words[: batch * (len(words) // batch)]]).view(batch, -1).t()
    embedding = torch.nn.Embedding(n, d)
    torch.nn.init.uniform_(embedding.weight, -0.1, 0.1)
    lstm = torch.nn.LSTM(d, d)
    head = SelfOrganizedSoftmax(d, n, counts=torch.tensor([c for _, c in ranked]))
    params = [*embedding.parameters(), *lstm.parameters(), *head.parameters()]
    optimizer = torch.optim.Adagrad(params, lr=0.1)
    head.attach(optimizer)
    print("step | loss | input role: rows, median row norm | output role: rows, median row norm | ratio")
    for step in range(args.steps):
        for group in optimizer.param_groups:
            group["lr"] = 0.1 * (min(1.0, (step + 1) / args.warmup) if args.warmup else 1.0)
        ids = columns[step * bptt: step * bptt + bptt + 1]
        hidden, _ = lstm(embedding(ids[:-1]))
        _, loss = head(hidden.reshape(-1, d), ids[1:].reshape(-1))
        optimizer.zero_grad()
        loss.backward()
        inputs, outputs = embedding.weight.grad.norm(dim=1), head.weight.grad.norm(dim=1)
        inputs, outputs = inputs[inputs > 0], outputs[outputs > 0]
        print(f"{step:4d} | {loss.item():5.2f} | {inputs.numel():5d}, {inputs.median():.2e} | "
              f"{outputs.numel():5d}, {outputs.median():.2e} | {inputs.median() / outputs.median():6.1f}x")
        torch.nn.utils.clip_grad_norm_(params, 0.25)
        optimizer.step()


if __name__ == "__main__":
    main()
