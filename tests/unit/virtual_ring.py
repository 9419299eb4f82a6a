"""A ring-attention ring with no process group, for checking the ring's math in one process."""
from __future__ import annotations

from paddletrainer.parallel import ring_attention as ra


class VirtualRing(ra._Ring):
    """Rank ``rank`` of an ``n``-rank ring whose K/V blocks are the virtual ranks' (an all-gather's view)."""

    def __init__(self, n, rank, blocks):
        self.group, self.rotation, self.n, self.rank, self._blocks = None, "allgather", n, rank, blocks

    def blocks(self, tensors):
        for step in range(self.n):
            yield step, list(self._blocks[self.owner(step)])
