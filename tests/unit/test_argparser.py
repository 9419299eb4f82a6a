"""PdArgumentParser: every way values arrive (CLI, dict, JSON, YAML, file + CLI) and how they are checked."""

import contextlib
import json
import re
import sys
from dataclasses import dataclass, field
from enum import Enum
from typing import List, Literal, Optional

import pytest

from paddletrainer.argparser import PdArgumentParser, strtobool
from paddletrainer.training_args import TrainingArguments


class Color(Enum):
    RED = "red"
    BLUE = "blue"


@dataclass
class ModelArguments:
    model_name_or_path: str = field(metadata={"help": "Model to load (100% required)."})
    dropout: float = field(default=0.1, metadata={"help": "Dropout probability."})
    use_flash: bool = field(default=True, metadata={"help": "Use flash attention."})
    color: Color = field(default=Color.RED, metadata={"help": "An enum option."})
    size: Literal["small", "large"] = field(default="small", metadata={"help": "A literal option."})


@dataclass
class DataArguments:
    max_length: int = field(default=128, metadata={"help": "Maximum sequence length."})
    debug: bool = field(default=False, metadata={"help": "Debug mode."})
    cache_dir: Optional[str] = field(default=None, metadata={"help": "Cache directory."})
    limit: Optional[int] = field(default=None, metadata={"help": "Sample limit."})
    splits: List[str] = field(default_factory=lambda: ["train"], metadata={"help": "Splits."})
    lengths: Optional[List[int]] = field(default=None, metadata={"help": "Lengths."})
    intervals: Optional[List[List[int]]] = field(default=None, metadata={"help": "Intervals."})


@contextlib.contextmanager
def usage_error(capsys, pattern):
    """Bad command-line or file input ends as argparse does: usage line, ``error: ...`` naming it, exit 2."""
    with pytest.raises(SystemExit) as info:
        yield
    err = capsys.readouterr().err
    assert info.value.code == 2, err
    assert err.startswith("usage: ") and "error: " in err, err
    assert re.search(pattern, err), err


def make_parser():
    return PdArgumentParser((ModelArguments, DataArguments))


def parse(argv):
    return make_parser().parse_args_into_dataclasses(argv, look_for_args_file=False)


# ---------------------------------------------------------------- command line
def test_cli_values_get_the_field_types():
    model, data = parse(["--model_name_or_path", "m", "--dropout", "0.3", "--max_length", "64", "--limit", "5"])
    assert (model.model_name_or_path, model.dropout, data.max_length, data.limit) == ("m", 0.3, 64, 5)
    assert isinstance(data.max_length, int) and isinstance(model.dropout, float)


def test_cli_defaults_apply_to_options_not_given():
    model, data = parse(["--model_name_or_path", "m"])
    assert model == ModelArguments(model_name_or_path="m")
    assert data == DataArguments()


@pytest.mark.parametrize(
    "argv, expected",
    [
        (["--debug"], True),
        (["--debug", "True"], True),
        (["--debug", "true"], True),
        (["--debug", "1"], True),
        (["--debug", "yes"], True),
        (["--debug", "False"], False),
        (["--debug", "false"], False),
        (["--debug", "0"], False),
        (["--debug", "no"], False),
    ],
)
def test_bool_options_accept_bare_flag_and_truthy_words(argv, expected):
    _, data = parse(["--model_name_or_path", "m", *argv])
    assert data.debug is expected


def test_no_prefix_turns_off_a_bool_that_defaults_to_true():
    model, _ = parse(["--model_name_or_path", "m", "--no_use_flash"])
    assert model.use_flash is False


def test_no_prefix_does_not_exist_for_bools_that_default_to_false(capsys):
    with usage_error(capsys, "--no_debug"):
        parse(["--model_name_or_path", "m", "--no_debug"])


def test_bool_option_rejects_a_non_boolean_word(capsys):
    with pytest.raises(SystemExit):
        parse(["--model_name_or_path", "m", "--debug", "maybe"])
    assert "--debug" in capsys.readouterr().err


def test_enum_and_literal_fields_become_choices(capsys):
    parser = make_parser()
    assert parser._option_string_actions["--color"].choices == ["red", "blue"]
    assert parser._option_string_actions["--size"].choices == ["small", "large"]
    model, _ = parser.parse_args_into_dataclasses(
        ["--model_name_or_path", "m", "--color", "blue", "--size", "large"], look_for_args_file=False
    )
    assert (model.color, model.size) == ("blue", "large")
    with pytest.raises(SystemExit):
        parse(["--model_name_or_path", "m", "--size", "huge"])
    assert "invalid choice" in capsys.readouterr().err


def test_list_fields_take_several_values_and_optional_lists_stay_none():
    _, data = parse(["--model_name_or_path", "m", "--splits", "train", "dev", "--lengths", "1", "2"])
    assert data.splits == ["train", "dev"] and data.lengths == [1, 2]
    _, data = parse(["--model_name_or_path", "m"])
    assert data.lengths is None and data.splits == ["train"]


def test_list_of_lists_is_built_from_repeated_options():
    _, data = parse(["--model_name_or_path", "m", "--intervals", "1", "5", "--intervals", "8", "9"])
    assert data.intervals == [[1, 5], [8, 9]]


def test_unknown_cli_option_is_an_error_naming_it_with_a_suggestion(capsys):
    with usage_error(capsys, r"error: .*--max_lenght.*did you mean max_length"):
        parse(["--model_name_or_path", "m", "--max_lenght", "3"])


def test_option_prefixes_are_not_abbreviated(capsys):
    with usage_error(capsys, "--max_len "):
        parse(["--model_name_or_path", "m", "--max_len", "3"])


def test_return_remaining_strings_hands_back_unknown_options():
    *_, remaining = make_parser().parse_args_into_dataclasses(
        ["--model_name_or_path", "m", "--extra", "1"], return_remaining_strings=True, look_for_args_file=False
    )
    assert remaining == ["--extra", "1"]


def test_missing_required_option_is_named(capsys):
    with usage_error(capsys, "error: .*--model_name_or_path"):
        parse([])


def test_several_dataclasses_come_back_in_order_with_training_arguments(tmp_path):
    parser = PdArgumentParser([ModelArguments, DataArguments, TrainingArguments])
    model, data, training = parser.parse_args_into_dataclasses(
        ["--model_name_or_path", "m", "--max_length", "9", "--output_dir", str(tmp_path), "--fp16"],
        look_for_args_file=False,
    )
    assert isinstance(model, ModelArguments) and isinstance(data, DataArguments)
    assert isinstance(training, TrainingArguments)
    assert (model.model_name_or_path, data.max_length, training.fp16) == ("m", 9, True)


def test_extra_arguments_added_to_the_parser_come_back_as_a_namespace():
    parser = make_parser()
    parser.add_argument("--my_flag", type=int, default=3)
    model, data, namespace = parser.parse_args_into_dataclasses(["--model_name_or_path", "m"], look_for_args_file=False)
    assert namespace.my_flag == 3


def test_args_file_is_read_before_the_command_line(tmp_path):
    args_file = tmp_path / "run.args"
    args_file.write_text("--model_name_or_path from_file --max_length 7")
    model, data = make_parser().parse_args_into_dataclasses(["--max_length", "9"], args_filename=str(args_file))
    assert model.model_name_or_path == "from_file"
    assert data.max_length == 9  # the command line comes later, so it wins


def test_help_shows_field_help_and_defaults():
    text = make_parser().format_help()
    assert "Maximum sequence length. (default: 128)" in text
    assert "100% required" in text  # a literal % must not break argparse's %-formatting


# ---------------------------------------------------------------- dict
def test_parse_dict_coerces_json_style_values_to_field_types():
    model, data = make_parser().parse_dict(
        {"model_name_or_path": "m", "use_flash": 0, "debug": "yes", "max_length": "64", "dropout": 1,
         "lengths": 5, "color": Color.BLUE}
    )
    assert model.use_flash is False and data.debug is True
    assert data.max_length == 64 and model.dropout == 1.0 and isinstance(model.dropout, float)
    assert data.lengths == [5]  # a single value for a list field becomes a one-element list
    assert model.color == "blue"


def test_parse_dict_rejects_unknown_keys_naming_them():
    with pytest.raises(ValueError) as err:
        make_parser().parse_dict({"model_name_or_path": "m", "dropuot": 0.2, "zzz": 1})
    message = str(err.value)
    assert "dropuot" in message and "zzz" in message and "did you mean dropout" in message


def test_parse_dict_ignores_unknown_keys_when_allowed():
    model, _ = make_parser().parse_dict({"model_name_or_path": "m", "zzz": 1}, allow_extra_keys=True)
    assert model.model_name_or_path == "m"


@pytest.mark.parametrize(
    "key, value",
    [("debug", "maybe"), ("max_length", 1.5), ("max_length", True), ("size", "huge"), ("dropout", [1]),
     ("intervals", [1, 2]), ("model_name_or_path", {"a": 1})],
)
def test_parse_dict_rejects_values_that_do_not_fit_naming_the_field(key, value):
    values = {"model_name_or_path": "m", key: value}
    with pytest.raises(ValueError, match=f"invalid value for {key}"):
        make_parser().parse_dict(values)


def test_strtobool_accepts_bools_ints_and_words_only():
    assert strtobool(True) is True and strtobool(0) is False and strtobool("Y") is True
    with pytest.raises(ValueError):
        strtobool(2)


# ---------------------------------------------------------------- files
def test_parse_json_file(tmp_path):
    path = tmp_path / "cfg.json"
    path.write_text(json.dumps({"model_name_or_path": "m", "debug": 1, "splits": ["a", "b"]}))
    model, data = make_parser().parse_json_file(str(path))
    assert model.model_name_or_path == "m" and data.debug is True and data.splits == ["a", "b"]


def test_parse_json_file_rejects_unknown_keys_naming_file_and_key(tmp_path, capsys):
    path = tmp_path / "cfg.json"
    path.write_text(json.dumps({"model_name_or_path": "m", "not_an_option": 1}))
    with usage_error(capsys, r"error: .*cfg\.json.*not_an_option"):
        make_parser().parse_json_file(str(path))


def test_parse_json_file_returns_unknown_keys_as_strings_when_asked(tmp_path):
    path = tmp_path / "cfg.json"
    path.write_text(json.dumps({"model_name_or_path": "m", "extra": [1, 2]}))
    *_, remaining = make_parser().parse_json_file(str(path), return_remaining_strings=True)
    assert remaining == ["--extra", "1", "2"]


def test_parse_yaml_file(tmp_path):
    path = tmp_path / "cfg.yaml"
    path.write_text("model_name_or_path: m\nuse_flash: false\nlengths: [3, 4]\nsize: large\n")
    model, data = make_parser().parse_yaml_file(str(path))
    assert model.use_flash is False and data.lengths == [3, 4] and model.size == "large"


def test_parse_yaml_file_rejects_unknown_keys(tmp_path, capsys):
    path = tmp_path / "cfg.yml"
    path.write_text("model_name_or_path: m\nbogus: 1\n")
    with usage_error(capsys, "error: .*bogus"):
        make_parser().parse_yaml_file(str(path))


def test_a_file_whose_top_level_is_not_a_mapping_is_rejected(tmp_path, capsys):
    path = tmp_path / "cfg.json"
    path.write_text("[1, 2]")
    with usage_error(capsys, "error: .*mapping"):
        make_parser().parse_json_file(str(path))


@pytest.mark.parametrize("suffix, content", [(".json", '{"model_name_or_path": "m", "max_length": 10, "debug": true}'),
                                             (".yaml", "model_name_or_path: m\nmax_length: 10\ndebug: true\n")])
def test_command_line_overrides_the_config_file(tmp_path, monkeypatch, suffix, content):
    path = tmp_path / f"cfg{suffix}"
    path.write_text(content)
    monkeypatch.setattr(sys, "argv", ["train.py", str(path), "--max_length", "20", "--debug", "false"])
    parser = make_parser()
    method = parser.parse_json_file_and_cmd_lines if suffix == ".json" else parser.parse_yaml_file_and_cmd_lines
    model, data = method()
    assert model.model_name_or_path == "m"  # from the file
    assert data.max_length == 20 and data.debug is False  # from the command line


def test_file_and_cmd_lines_rejects_unknown_options_on_either_side(tmp_path, monkeypatch, capsys):
    path = tmp_path / "cfg.json"
    path.write_text('{"model_name_or_path": "m", "bad_key": 1}')
    monkeypatch.setattr(sys, "argv", ["train.py", str(path)])
    with usage_error(capsys, "error: .*bad_key"):
        make_parser().parse_json_file_and_cmd_lines()
    path.write_text('{"model_name_or_path": "m"}')
    monkeypatch.setattr(sys, "argv", ["train.py", str(path), "--bad_option", "1"])
    with usage_error(capsys, "error: .*--bad_option"):
        make_parser().parse_json_file_and_cmd_lines()


def test_file_and_cmd_lines_needs_the_file_first(monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", ["train.py", "--max_length", "3"])
    with usage_error(capsys, r"error: .*\.json"):
        make_parser().parse_json_file_and_cmd_lines()
    with usage_error(capsys, r"error: .*\.yaml"):
        make_parser().parse_yaml_file_and_cmd_lines()


# ---------------------------------------------------------------- validation errors of the dataclasses
@dataclass
class Checked:
    ratio: float = field(default=0.5, metadata={"help": "A ratio."})
    steps: int = field(default=1, metadata={"help": "Steps."})

    def __post_init__(self):
        if not 0 <= self.ratio <= 1:
            raise ValueError(f"ratio={self.ratio} is invalid: must lie in [0, 1] (steps={self.steps})")


def test_a_dataclass_validation_error_is_a_usage_error_naming_the_option_given(capsys, tmp_path):
    with usage_error(capsys, r"error: argument --ratio: ratio=2.0 is invalid: must lie in \[0, 1\]"):
        PdArgumentParser(Checked).parse_args_into_dataclasses(["--steps", "3", "--ratio", "2"],
                                                              look_for_args_file=False)
    path = tmp_path / "cfg.json"
    path.write_text('{"ratio": 3}')
    with usage_error(capsys, r"error: argument --ratio: ratio=3.0 is invalid.*\(in .*cfg\.json\)"):
        PdArgumentParser(Checked).parse_json_file(str(path))


def test_programmatic_paths_keep_raising_value_error():
    with pytest.raises(ValueError, match="ratio=2.0 is invalid"):
        PdArgumentParser(Checked).parse_dict({"ratio": 2})
    with pytest.raises(ValueError, match="ratio=2.0 is invalid"):
        PdArgumentParser(Checked, exit_on_error=False).parse_args_into_dataclasses(["--ratio", "2"],
                                                                                  look_for_args_file=False)
    with pytest.raises(ValueError, match="ratio=2.0 is invalid"):
        Checked(ratio=2.0)


def test_a_missing_or_malformed_config_file_is_a_usage_error(capsys, tmp_path):
    with usage_error(capsys, r"error: .*nowhere\.json: No such file"):
        make_parser().parse_json_file(str(tmp_path / "nowhere.json"))
    bad = tmp_path / "bad.yaml"
    bad.write_text("a: [1, 2\n")
    with usage_error(capsys, r"error: .*bad\.yaml: not valid YAML"):
        make_parser().parse_yaml_file(str(bad))
