"""The multi-process stop check reads ``logging_strategy`` exactly as ``TrainingArguments`` does."""
import pytest
from paddlenlp.trainer.trainer_utils import IntervalStrategy as PaddleNLPIntervalStrategy

from paddletrainer import TrainingArguments
from paddletrainer.runtime.signals import MAX_CHECK_INTERVAL, check_interval
from paddletrainer.trainer_utils import IntervalStrategy


@pytest.mark.parametrize("spelling, expected", [
    ("steps", 4), (IntervalStrategy.STEPS, 4), (PaddleNLPIntervalStrategy.STEPS, 4),
    ("epoch", MAX_CHECK_INTERVAL), (IntervalStrategy.EPOCH, MAX_CHECK_INTERVAL),
    (PaddleNLPIntervalStrategy.EPOCH, MAX_CHECK_INTERVAL), ("no", MAX_CHECK_INTERVAL),
])
def test_every_spelling_the_arguments_accept_gives_the_interval_of_its_parsed_value(tmp_path, spelling, expected):
    args = TrainingArguments(output_dir=str(tmp_path), logging_strategy=spelling, logging_steps=4)
    assert check_interval(spelling, 4) == check_interval(args.logging_strategy, args.logging_steps) == expected


@pytest.mark.parametrize("spelling", ["STEPS", "Steps", "step", "bogus"])
def test_a_spelling_the_arguments_refuse_is_refused_not_guessed(tmp_path, spelling):
    with pytest.raises(ValueError, match="logging_strategy"):
        TrainingArguments(output_dir=str(tmp_path), logging_strategy=spelling, logging_steps=4)
    with pytest.raises(ValueError, match="no, steps, epoch"):
        check_interval(spelling, 4)
