"""A weight-sized gradient buffer reused across steps, for heads that write their weight's gradient themselves.

At a large vocabulary a freshly allocated ``N x d`` gradient each step costs more
than a head's arithmetic (the page faults of a new buffer, then a pass to zero
it), while a step touches only some rows. The two-level heads (a block per
cluster present in the batch) and :class:`~sohsm.heads.TreeSoftmax` (the rows
of the nodes on the batch's paths) therefore keep one buffer, hand it over as
``weight.grad``, and at the next step zero only the parts they wrote before.
"""
from __future__ import annotations

import weakref

import torch
from torch import Tensor, nn

#: a part of the buffer a step wrote: rows ``start .. stop - 1``, or the rows of an index tensor
Region = "tuple[int, int] | Tensor"


def gradient_route(ctx, index: int, edge: int | None = None) -> str:
    """What the backward now running wants of the op's input ``index`` (the head's weight), asked in the op's backward
    (``edge``: its place among the op's tensor inputs, which alone have an edge; ``index`` when all before it are).

    ``"sink"``: a ``backward()`` that accumulates the weight's gradient into ``.grad``; the op writes it there itself,
    row block by row block (the reason the head keeps a :class:`ReusedGradient`). ``"return"``: ``autograd.grad`` asks
    for the weight's gradient (it must come back, and no ``.grad`` be written), or ``create_graph`` builds a graph of
    it, or the input is not a leaf: the op returns it, dense. ``"none"``: this backward does not reach the weight
    (``autograd.grad(loss, [hidden])``, ``backward(inputs=[...])`` without it): nothing is computed or written.
    """
    if not ctx.needs_input_grad[index]:
        return "none"
    node = ctx.next_functions[index if edge is None else edge][0]
    will_execute = getattr(torch._C, "_will_engine_execute_node", None)
    if node is None:
        return "none"
    if torch.is_grad_enabled() or will_execute is None or type(node).__name__ != "AccumulateGrad":
        return "return"
    try:
        return "sink" if will_execute(node) else "none"
    except RuntimeError:  # autograd.grad was given this leaf: the engine captures its gradient, .grad stays untouched
        return "return"


def distributed() -> bool:
    """Whether a process group is up (DDP, or anything else that may write into ``.grad``)."""
    return torch.distributed.is_available() and torch.distributed.is_initialized()


class ReusedGradient:
    """A weight-sized gradient buffer that lives across steps, with a record of the rows written into it.

    The head writes (or adds) the rows of a step into the buffer and hands it over
    as the weight's ``.grad``; at the next step the rows written before are zeroed
    (except those the caller overwrites) and everything else is known to be zero.

    Under ``torch.distributed`` anyone may write into the buffer while it is
    ``.grad`` (DDP's all-reduce copies the mean gradient of *all* ranks' rows into
    it). The tensor's version counter tells: after a write the head did not make,
    the next step zeroes the whole buffer (one ``memset``, still far cheaper than a
    fresh allocation) instead of trusting its record. In one process only scalings
    and zeroing happen (see :meth:`known`).
    """

    def __init__(self) -> None:
        self.tensor: Tensor | None = None
        self.dirty: list | None = None  # regions that may be non-zero; None = unknown
        self.version = -1  # the tensor's version after the head's last write
        #: someone else adds into the buffer too (an input embedding tied to the weight): its record never holds
        self.shared = False
        self.owner: weakref.ref | None = None  # the weight the buffer is handed to as .grad

    def __getstate__(self) -> dict:  # a pickled head (torch.save of the module) holds no weak reference
        return {**self.__dict__, "owner": None}

    def invalidate(self) -> None:
        self.dirty = None

    def known(self) -> bool:
        """Whether :attr:`dirty` holds: no one but the head has written into the buffer since.

        In one process the only writes into ``.grad`` between steps are scalings and
        zeroing (gradient clipping, ``zero_grad``), which keep a zero row zero, so
        the record holds whatever the version counter says; clipping bumps it every
        step, and a full ``memset`` then would cost a pass over ``N x d`` floats.
        Under ``torch.distributed`` a write may fill any row, so the counter decides.
        """
        if self.dirty is None or self.tensor is None or self.shared:
            return False
        return self.tensor._version == self.version or not distributed()

    def fresh(self, weight: Tensor, keep: frozenset = frozenset()) -> Tensor:
        """The buffer, zero outside the ``(start, stop)`` regions in ``keep`` (which the caller overwrites).

        The buffer is one weight's ``.grad`` at a time: asked for another weight (a parameter swapped in by
        ``torch.func.functional_call``) while the first still holds it, it returns a zero tensor of its own.
        """
        owner = None if self.owner is None else self.owner()
        if owner is not None and owner is not weight and self.tensor is not None and owner.grad is self.tensor:
            return torch.zeros_like(weight, memory_format=torch.contiguous_format)
        self.owner = weakref.ref(weight)
        t = self.tensor
        if t is None or t.shape != weight.shape or t.dtype != weight.dtype or t.device != weight.device:
            self.tensor = t = torch.zeros_like(weight, memory_format=torch.contiguous_format)
        elif not self.known():
            t.zero_()
        else:
            assert self.dirty is not None  # (known() holds)
            for region in self.dirty:
                if isinstance(region, Tensor):
                    t.index_fill_(0, region, 0.0)
                elif region not in keep:
                    t[region[0] : region[1]].zero_()
        self.dirty = []
        self.version = t._version
        return t

    def written(self, regions: list, known: bool) -> None:
        """The head has just written ``regions``; ``known``: :meth:`known` held before the write."""
        assert self.tensor is not None  # the head wrote into the buffer fresh() handed out
        if known:
            assert self.dirty is not None  # (known() held)
            self.dirty.extend(regions)
        else:
            self.dirty = None
        self.version = self.tensor._version


class WritesWeightGradient(nn.Module):
    """Mixin of heads whose backward writes ``weight.grad`` itself (through a :class:`ReusedGradient`).

    Such a head cannot run as a replica (``nn.DataParallel`` on several devices: the
    replica's weight is a copy, so its gradient would be lost) nor on a sharded or
    flattened weight (FSDP, ZeRO-3, tensor parallelism): both are refused with a message.
    """

    weight: Tensor  # the head's word vectors (a parameter), unless it names others (:meth:`_gradient_weights`)

    def _replicate_for_data_parallel(self):
        raise RuntimeError(
            f"{type(self).__name__} cannot run under nn.DataParallel on several devices: it writes its "
            "weight gradient into weight.grad itself, and a replica's weight is a copy, so the gradient "
            "would be lost. Use DistributedDataParallel (one process per device)."
        )

    def _gradient_weights(self) -> list[Tensor]:
        """The parameters whose gradient the head writes itself: :attr:`weight` here; a head that keeps its word
        vectors in several parameters (a two-level head's bands) names them."""
        return [self.weight]

    def _check_weight_is_whole(self) -> None:
        """Refuse a sharded or flattened :attr:`weight` (FSDP, tensor parallel): the kernel needs all its rows."""
        for weight in self._gradient_weights():
            self._check_whole(weight)

    def _check_whole(self, weight: Tensor) -> None:
        # DTensor's public home (torch.distributed.tensor) appeared in torch 2.5 and this package supports 2.4:
        # its class name is the test that works across the supported versions
        sharded = any(cls.__name__ == "DTensor" for cls in type(weight).__mro__)
        flattened = not isinstance(weight, nn.Parameter) or (
            weight.untyped_storage().nbytes() != weight.numel() * weight.element_size())
        if sharded or flattened:
            raise RuntimeError(
                f"{type(self).__name__}.weight is {'sharded' if sharded else 'a view into a larger flat buffer'} "
                "(FSDP, ZeRO-3 or tensor parallelism?): the head writes the gradient of every row of the "
                "weight itself, so it cannot run on a shard. Leave the head out of the sharded modules "
                "(e.g. FSDP's ignored_modules) and wrap it in DistributedDataParallel."
            )
