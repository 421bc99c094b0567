"""Freezing the self-organized head: its clusters stay as they are, its weights may be learned afresh."""
from __future__ import annotations

import torch


class Freezing:
    """Mixin of :class:`~sohsm.heads.SelfOrganizedSoftmax`: stop re-clustering, optionally reset the weights.

    ``reset_on_freeze``: ``"none"`` keeps the weights; ``"head"`` re-initialises them and zeroes
    their optimizer state; ``"head_keep_state"`` re-initialises them and keeps the state.
    """

    @torch.no_grad()
    def freeze(self, optimizer: torch.optim.Optimizer | None = None) -> None:
        """Stop re-clustering; with ``reset_on_freeze`` re-initialise the head's weights on the final clusters."""
        self.frozen = True
        if self.reset_on_freeze == "none":
            return
        self.reset_parameters()
        if self.reset_on_freeze == "head_keep_state":
            return
        for p in self.parameters():
            for value in self._optimizer_state(p, optimizer):
                value.zero_()
