"""The processes of a training run: one, or several started by ``torchrun`` (DDP).

Under ``torchrun --nproc-per-node N`` every process runs the same command; the
environment names its ``RANK``, ``LOCAL_RANK`` and ``WORLD_SIZE``.
:meth:`Ranks.join` starts the process group from it (gloo on the CPU, nccl on
GPUs), and the loop asks :class:`Ranks` for the few things that differ between
processes::

    every rank                                   rank 0 only
    ----------                                   -----------
    its share of the batch columns               the run directory, its lock, config.json, vocab.json
    forward, backward (DDP averages gradients)   metrics.jsonl, the progress bar, checkpoints
    the same optimizer step, the same stop       (checkpoints gather the ranks' LSTM states and
    its share of the dev columns (sums added)     random states first: a collective)

A head that keeps statistics (the self-organized head) merges them across the
ranks itself and broadcasts its assignment; nothing here knows about heads.
"""
from __future__ import annotations

import datetime
import inspect
import os
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor, nn

from sohsm.heads.base import Head

#: how long a collective may wait for the other ranks before the run fails
TIMEOUT = datetime.timedelta(minutes=30)

#: whether this process started a process group (see :func:`started_a_group`)
_STARTED_A_GROUP = False


def started_a_group() -> bool:
    """Whether this process started a process group (:meth:`Ranks.join` under ``torchrun``).

    Such a process should end without the interpreter's shutdown (``os._exit`` after flushing,
    as the ``sohsm`` command does): with torch 2.13, a gloo group outlives
    ``destroy_process_group`` once DistributedDataParallel wrapped a module, and its worker
    threads may still be letting go of the last collective's tensors, which takes the GIL; a
    thread that asks for the GIL while the interpreter finalizes aborts the process
    (SIGABRT, "terminate called without an active exception") after a run that succeeded.
    A barrier before leaving does not prevent it.
    """
    return _STARTED_A_GROUP


def requested_world_size() -> int:
    """The number of processes ``torchrun`` started (``WORLD_SIZE``), or 1."""
    try:
        return max(int(os.environ.get("WORLD_SIZE", "1")), 1)
    except ValueError:
        raise ValueError(f"WORLD_SIZE must be an integer, got {os.environ['WORLD_SIZE']!r}") from None


class Ranks:
    """This process's place among the run's processes, and the collectives the loop needs.

    With one process every method is a plain local operation (nothing is sent).

    Attributes:
        rank: this process's rank (0 writes the run's files).
        world: the number of processes.
        device: where this process trains (``cuda:LOCAL_RANK`` on GPUs).
    """

    def __init__(self, rank: int = 0, world: int = 1, device: torch.device | str = "cpu",
                 owns_group: bool = False) -> None:
        self.rank, self.world, self.device = rank, world, torch.device(device)
        self._owns_group = owns_group

    # -- joining ------------------------------------------------------------------------------
    @classmethod
    def join(cls, device: str) -> Ranks:
        """The ranks of this run: one process, or the process group of ``torchrun`` (started here if needed).

        Args:
            device: the run's device, ``"cpu"`` or ``"cuda"`` when there are several
                processes (each then takes the GPU of its ``LOCAL_RANK``).

        Raises:
            ValueError: several processes with a device that names one GPU (``cuda:1``) or is
                neither CPU nor CUDA.
        """
        world = dist.get_world_size() if dist.is_available() and dist.is_initialized() else requested_world_size()
        if world == 1:
            return cls(device=device)
        base = torch.device(device)
        if base.type not in ("cpu", "cuda") or base.index is not None:
            raise ValueError(f"with {world} processes the device must be 'cpu' or 'cuda' (each process takes "
                             f"the GPU of its LOCAL_RANK), got {device!r}")
        if base.type == "cuda":
            local = int(os.environ.get("LOCAL_RANK", "0"))
            torch.cuda.set_device(local)
            base = torch.device("cuda", local)
        owns = False
        if not dist.is_initialized():
            global _STARTED_A_GROUP
            dist.init_process_group("nccl" if base.type == "cuda" else "gloo", timeout=TIMEOUT)
            owns = _STARTED_A_GROUP = True
        return cls(dist.get_rank(), dist.get_world_size(), base, owns_group=owns)

    def leave(self) -> None:
        """End the process group if :meth:`join` started it."""
        if self._owns_group and dist.is_initialized():
            dist.destroy_process_group()
            self._owns_group = False

    def __enter__(self) -> Ranks:
        return self

    def __exit__(self, *exc) -> None:
        self.leave()

    @property
    def is_writer(self) -> bool:
        """Whether this process writes the run's files (rank 0)."""
        return self.rank == 0

    # -- set-up on rank 0 -----------------------------------------------------------------------
    def first(self, action: Callable[[], Any]) -> None:
        """Run ``action`` on rank 0; if it fails, every rank raises (a ValueError with its message).

        For the steps only rank 0 takes (creating and locking the run directory):
        the other ranks wait for the outcome instead of running on alone.
        """
        error: BaseException | None = None
        if self.is_writer:
            try:
                action()
            except Exception as caught:  # noqa: BLE001 - sent to the other ranks, then raised again
                error = caught
        if self.world > 1:
            message = [None if error is None else str(error)]
            dist.broadcast_object_list(message, src=0)
            if error is None and message[0] is not None:
                raise ValueError(message[0])
        if error is not None:
            raise error

    # -- collectives of the loop ----------------------------------------------------------------
    def sum_(self, tensor: Tensor) -> Tensor:
        """Add ``tensor`` over the ranks, in place (returns it)."""
        if self.world > 1:
            dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
        return tensor

    def any(self, *flags: bool) -> tuple[bool, ...]:
        """Each flag, set if it is set on some rank (one collective for all of them)."""
        if self.world == 1:
            return tuple(bool(f) for f in flags)
        values = torch.tensor([float(f) for f in flags], dtype=torch.float64, device=self.device)
        return tuple(v > 0 for v in self.sum_(values).tolist())

    def seed_own_stream(self, seed: int) -> None:
        """Give ranks other than 0 random streams of their own (dropout masks, sampled words).

        Called after the model is built from ``seed`` on every rank; rank 0 keeps the
        stream one process would have.
        """
        if self.rank:
            torch.manual_seed(seed * 1_000_003 + self.rank)

    def gather(self, tensor: Tensor, dim: int) -> Tensor:
        """Every rank's ``tensor`` (all the same shape) joined along ``dim`` in rank order."""
        if self.world == 1:
            return tensor
        parts = [torch.empty_like(tensor) for _ in range(self.world)]
        dist.all_gather(parts, tensor.contiguous())
        return torch.cat(parts, dim=dim)

    def gather_objects(self, obj: Any) -> list[Any]:
        """Every rank's ``obj`` (picklable), in rank order."""
        if self.world == 1:
            return [obj]
        out: list[Any] = [None] * self.world
        dist.all_gather_object(out, obj)
        return out

    def share(self, size: int) -> slice:
        """This rank's part of ``size`` items cut into ``world`` contiguous parts (sizes differ by at most 1)."""
        base, extra = divmod(size, self.world)
        start = self.rank * base + min(self.rank, extra)
        return slice(start, start + base + (self.rank < extra))

    def wrap(self, module: nn.Module) -> nn.Module:
        """``module`` in :class:`~torch.nn.parallel.DistributedDataParallel` with several ranks, else itself.

        Buffers are synchronised once, at construction: the heads keep theirs equal
        themselves (the self-organized head broadcasts each new assignment), and
        sending them at every forward would cost ``N`` words a step. Unused
        parameters are searched for only where a head says it can leave some out in a step
        (:attr:`~sohsm.heads.Head.skips_parameters`: adaptive softmax skips the tail clusters no target falls in).
        """
        if self.world == 1:
            return module
        conditional = any(isinstance(m, Head) and m.skips_parameters for m in module.modules())
        device_ids = [self.device.index] if self.device.type == "cuda" else None
        return nn.parallel.DistributedDataParallel(module, device_ids=device_ids, find_unused_parameters=conditional,
                                                   **no_buffer_sync_at_forward())


def no_buffer_sync_at_forward(ddp: type[Any] = nn.parallel.DistributedDataParallel) -> dict[str, Any]:
    """DDP's keyword that turns off the buffer broadcast at every forward, in this torch's spelling.

    torch 2.13 calls it ``forward_sync_buffers`` and deprecates ``broadcast_buffers``; the torch
    releases before it know only ``broadcast_buffers`` (both leave the sync at construction on).
    """
    if "forward_sync_buffers" in inspect.signature(ddp.__init__).parameters:
        return {"forward_sync_buffers": False}
    return {"broadcast_buffers": False}
