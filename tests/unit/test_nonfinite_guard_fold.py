"""The default ``nan_inf_policy=error`` guard keeps each step's norm unread and folds them into "the first
non-finite step" every ``FOLD_EVERY`` steps and at the check: the check reports the first bad step wherever
it falls relative to the folds, and never holds more than ``FOLD_EVERY`` norms."""
import math

import paddle
import pytest

from paddletrainer.errors import NonFiniteLossError
from paddletrainer.optim.overflow import STEP, NonfiniteGuard

SAMPLES_PER_STEP = 8


class State:
    def __init__(self):
        self.global_step, self.consumed_samples, self.epoch = 0, 0, None


def run(guard, state, bad: dict, steps: int):
    """``steps`` steps, norm 1.5 except ``bad[step]``; returns the largest number of norms the guard held."""
    held = 0
    for _ in range(steps):
        norm = bad.get(state.global_step + 1, 1.5)
        assert guard.decide(paddle.full([], norm, dtype="float32"), state) == STEP
        held = max(held, len(guard._pending))
        state.global_step += 1
        state.consumed_samples += SAMPLES_PER_STEP
    return held


@pytest.mark.parametrize("bad", [{2: math.nan}, {3: math.inf}, {5: math.nan}, {4: -math.inf, 8: math.nan},
                                 {10: math.nan}, {7: math.inf, 9: math.nan}],
                         ids=["first_fold", "last_of_first_fold", "second_fold", "two_folds_first_wins",
                              "kept_unfolded_until_the_check", "same_fold_first_wins"])
def test_the_check_names_the_first_non_finite_step_and_rewinds_to_the_step_before_it(bad):
    guard = NonfiniteGuard("error")
    guard.FOLD_EVERY = 3  # steps 1-3, 4-6 and 7-9 fold; the check at step 10 folds step 10
    state = State()
    held = run(guard, state, bad, steps=10)
    assert held < 3  # a full window is folded at once
    first = min(bad)
    with pytest.raises(NonFiniteLossError, match=rf"step {first}: gradient norm is {bad[first]}"):
        guard.raise_if_seen(state)
    assert (state.global_step, state.consumed_samples) == (first - 1, (first - 1) * SAMPLES_PER_STEP)


def test_finite_steps_pass_every_check_and_a_later_bad_step_is_still_found():
    guard = NonfiniteGuard("error")
    guard.FOLD_EVERY = 4
    state = State()
    run(guard, state, {}, steps=10)
    guard.raise_if_seen(state)  # nothing to report; the positions of steps 1-10 are forgotten
    assert state.global_step == 10
    run(guard, state, {13: math.nan}, steps=6)
    with pytest.raises(NonFiniteLossError, match="step 13: gradient norm is nan"):
        guard.raise_if_seen(state)
    assert (state.global_step, state.consumed_samples) == (12, 12 * SAMPLES_PER_STEP)
