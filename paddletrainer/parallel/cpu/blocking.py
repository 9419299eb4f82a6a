"""What the collective fills hand back to callers that ask for an asynchronous collective.

gloo's collectives block, so a fill has finished by the time it returns; callers that passed ``sync_op=False``
still expect a task with ``wait()``. Shared by the fills that replace Paddle's dygraph collectives
(:mod:`.reduce_scatter`, :mod:`.all_to_all`).
"""
from paddle.distributed import collective

__all__ = ["DoneTask", "group_or_world"]


class DoneTask:
    """The task of a collective that already finished (gloo collectives block)."""

    def wait(self, *args, **kwargs):
        return True

    def is_completed(self):
        return True

    def synchronize(self):
        return True


def group_or_world(group):
    """``group``, or the world group when it is None (Paddle's default)."""
    return collective._get_global_group() if group is None else group
