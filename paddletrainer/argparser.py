"""Dataclasses ⇄ command line, JSON, YAML and dict: the same contract as ``paddlenlp.trainer.PdArgumentParser``.

Every field of every dataclass becomes one ``--name`` option whose help text is ``field(metadata={"help": ...})``.
All entry points (command line, dict, JSON, YAML and the file-plus-command-line forms) end in one function,
:meth:`PdArgumentParser._build`, so a value means the same thing whichever way it arrives:

* a key or option that no dataclass declares is an error naming it (with a close match when there is one);
* a value is coerced to the field's type (``"fp16": 1`` gives ``True``, ``"seed": "7"`` gives ``7``) or rejected
  with the field name, the value and what was expected;
* options given on the command line override the same keys of the file.

Bad input from the command line or a config file (``parse_args_into_dataclasses``, ``parse_json_file``,
``parse_yaml_file`` and the file-plus-command-line forms) ends like any argparse error: the usage line, then
``<prog>: error: argument --<option>: <what is wrong and what is valid>`` on stderr and exit status 2 — no
traceback. That covers unknown options, values of the wrong type and every ``ValueError`` a dataclass raises
while it is built (e.g. ``TrainingArguments``' checks of degrees vs world size or of the resume path), on every
rank of a launched job. ``parse_dict`` and direct construction (``TrainingArguments(...)``) raise ``ValueError``;
so does a parser built with ``exit_on_error=False``.

Differences from PaddleNLP, on purpose: unknown dict/file keys are errors (PaddleNLP drops them silently from
``parse_dict``), option prefixes are not abbreviated (``--learning`` is not ``--learning_rate``), a float option
refuses NaN (it passes every range check a dataclass makes) and a text option refuses non-UTF-8 text (argv bytes
that are not UTF-8 arrive as lone surrogates, which no file or log can hold), a config or ``.args`` file that is a
directory, not UTF-8 or nested too deeply is a usage error naming it, and the PaddleCloud ``PDC_INIT_STEP`` resume
rewriting of ``parse_dict`` is not done.
"""

import argparse
import dataclasses
import difflib
import json
import math
import re
import sys
from enum import Enum
from inspect import isclass
from pathlib import Path
from typing import Any, Dict, Iterable, List, Literal, Optional, Tuple, Union, get_args, get_origin, get_type_hints

__all__ = ["PdArgumentParser", "strtobool", "RAW_VALUE"]

# Field-metadata key: a dict/file value of another type than the annotation is handed to the dataclass
# unchanged, for fields whose ``__post_init__`` accepts several shapes (e.g. ``sharding``: str, list or bool).
RAW_VALUE = "paddletrainer_raw_value"

_TRUE = ("yes", "true", "t", "y", "1")
_FALSE = ("no", "false", "f", "n", "0")


def strtobool(value: Any) -> bool:
    """Turn ``True/False``, ``1/0`` and ``yes/no/true/false/t/f/y/n/1/0`` (any case) into a bool."""
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    if isinstance(value, str) and value.strip().lower() in _TRUE + _FALSE:
        return value.strip().lower() in _TRUE
    raise ValueError(f"expected a boolean (true/false, 1/0, yes/no), got {value!r}")


class _OptionValueError(ValueError):
    """A value that does not fit its field's type; ``option`` names the field."""

    def __init__(self, option: str, message: str):
        super().__init__(message)
        self.option = option


@dataclasses.dataclass
class _FieldSpec:
    """How one dataclass field is read: its shape (``kind``), element type and allowed values."""

    name: str
    owner: type
    kind: str  # "bool" | "scalar" | "choice" | "list" | "list_of_lists" | "dict"
    base: Any  # element type for scalars and lists
    optional: bool
    choices: Optional[List[Any]]
    required: bool
    default: Any
    raw_ok: bool
    help: str


def _unwrap_optional(hint):
    if get_origin(hint) is Union:
        args = [a for a in get_args(hint) if a is not type(None)]
        if len(args) != 1:
            raise TypeError(f"only Optional[X] unions are supported, got {hint}")
        return args[0], True
    return hint, False


def _choices_of(hint) -> Optional[List[Any]]:
    if get_origin(hint) is Literal:
        return list(get_args(hint))
    if isclass(hint) and issubclass(hint, Enum):
        return [member.value for member in hint]
    return None


def _analyze(field: dataclasses.Field, hint, owner: type) -> _FieldSpec:
    """Classify a resolved type hint into the few shapes the parser knows."""
    hint, optional = _unwrap_optional(hint)
    choices = _choices_of(hint)
    kind, base = "scalar", hint
    if hint is bool:
        kind = "bool"
    elif choices is not None:
        kind, base = "choice", type(choices[0])
    elif get_origin(hint) in (list, List):
        elem = (get_args(hint) or (str,))[0]
        if get_origin(elem) in (list, List):
            kind, base = "list_of_lists", (get_args(elem) or (str,))[0]
        else:
            kind, base = "list", elem
            choices = _choices_of(elem)
            if choices is not None:
                base = type(choices[0])
    elif hint is dict or get_origin(hint) in (dict, Dict):
        kind = "dict"
    if field.metadata.get("choices") is not None:
        choices = list(field.metadata["choices"])
        kind = "choice" if kind == "scalar" else kind
    has_default = field.default is not dataclasses.MISSING or field.default_factory is not dataclasses.MISSING
    default = field.default if field.default is not dataclasses.MISSING else None
    if field.default_factory is not dataclasses.MISSING:
        default = field.default_factory()
    return _FieldSpec(
        name=field.name,
        owner=owner,
        kind=kind,
        base=base,
        # a field whose default is None accepts None even when annotated without Optional (PaddleNLP has many)
        optional=optional or (has_default and default is None),
        choices=choices,
        required=not has_default,
        default=default,
        raw_ok=bool(field.metadata.get(RAW_VALUE, False)),
        help=field.metadata.get("help", ""),
    )


_TYPE_NAMES = {float: "float (not NaN)", str: "str (UTF-8 text)"}


def _expected(spec: _FieldSpec) -> str:
    if spec.choices is not None:
        return "one of: " + ", ".join(str(c) for c in spec.choices)
    if spec.kind == "bool":
        return "a boolean (true/false, 1/0, yes/no)"
    name = _TYPE_NAMES.get(spec.base) or getattr(spec.base, "__name__", str(spec.base))
    return {"list": f"a list of {name}", "list_of_lists": f"a list of lists of {name}", "dict": "a JSON object"}.get(
        spec.kind, f"a value of type {name}"
    )


def _coerce_scalar(base, value):
    if isinstance(value, Enum):
        value = value.value
    if base is int:
        if isinstance(value, bool):
            raise ValueError
        if isinstance(value, float) and not value.is_integer():
            raise ValueError
        return int(value)
    if base is float:
        if isinstance(value, bool) or math.isnan(float(value)):  # NaN passes every range check a dataclass makes
            raise ValueError
        return float(value)
    if base is str:
        # numbers become text as they do through PaddleNLP's JSON → command-line path ("save_steps": 5 → "5")
        if isinstance(value, bool) or not isinstance(value, (str, int, float)):
            raise ValueError
        text = str(value)
        # non-UTF-8 bytes of argv arrive as lone surrogates (JSON can spell them too); no file or log holds them:
        # encode raises UnicodeEncodeError, a ValueError
        text.encode("utf-8")
        return text
    if base is bool:
        return strtobool(value)
    return value if isinstance(value, base) else base(value)


def _a_dict(value: Any) -> dict:
    if not isinstance(value, dict):
        raise ValueError("not a JSON object")
    return value


def json_object(text: str) -> dict:
    """A dict option's value from its JSON text (``ValueError`` for anything but an object, nesting included)."""
    try:
        return _a_dict(json.loads(text))
    except RecursionError:  # the parser recurses once per nesting level
        raise ValueError("nested too deeply") from None


json_object.__name__ = "JSON object"  # argparse names the type in "invalid <type> value"


def _coerce(spec: _FieldSpec, value: Any) -> Any:
    """Return ``value`` converted to the field's type; raise ValueError if it does not fit."""
    if value is None:
        if spec.optional:
            return None
        raise ValueError
    try:
        if spec.kind == "bool":
            return strtobool(value)
        if spec.kind == "dict":
            return json_object(value) if isinstance(value, str) else _a_dict(value)
        if spec.kind == "list_of_lists":
            if not isinstance(value, (list, tuple)) or not all(isinstance(v, (list, tuple)) for v in value):
                raise ValueError
            return [[_coerce_scalar(spec.base, x) for x in row] for row in value]
        if spec.kind == "list":
            items = list(value) if isinstance(value, (list, tuple)) else [value]
            result = [_coerce_scalar(spec.base, x) for x in items]
        else:
            result = _coerce_scalar(spec.base, value)
    except (TypeError, ValueError, OverflowError):  # OverflowError: float() of an int beyond the float range
        if spec.raw_ok:
            return value
        raise ValueError from None
    values = result if spec.kind == "list" else [result]
    if spec.choices is not None and any(v not in spec.choices for v in values):
        if spec.raw_ok:
            return value
        raise ValueError
    return result


def _help_text(spec: _FieldSpec) -> str:
    # argparse %-formats help strings, so a literal % in a help text must be doubled
    text = spec.help.replace("%", "%%")
    suffix = "required" if spec.required else f"default: {spec.default!r}"
    return f"{text} ({suffix})" if text else f"({suffix})"


class PdArgumentParser(argparse.ArgumentParser):
    """An ``argparse.ArgumentParser`` whose options are the fields of one or more dataclasses.

    Parse results come back as instances, in the order the dataclass types were given; extra (non-dataclass)
    arguments added with ``add_argument`` come back as one more ``argparse.Namespace``.
    """

    def __init__(self, dataclass_types: Union[type, Iterable[type]], **kwargs):
        """``dataclass_types``: a dataclass type or a list of them; ``kwargs`` go to ``argparse.ArgumentParser``."""
        kwargs.setdefault("allow_abbrev", False)  # "--learning" must not silently mean "--learning_rate"
        super().__init__(**kwargs)
        if dataclasses.is_dataclass(dataclass_types):
            dataclass_types = [dataclass_types]
        self.dataclass_types = list(dataclass_types)
        self._specs: Dict[str, _FieldSpec] = {}
        for dtype in self.dataclass_types:
            self._add_dataclass_arguments(dtype)

    # ---------------------------------------------------------------- building the options
    def _add_dataclass_arguments(self, dtype: type) -> None:
        try:
            hints = get_type_hints(dtype)
        except NameError as err:
            raise RuntimeError(f"cannot resolve the type hints of {dtype.__name__}: {err}") from err
        group = self.add_argument_group(dtype._argument_group_name) if hasattr(dtype, "_argument_group_name") else self
        for field in dataclasses.fields(dtype):
            if not field.init:
                continue
            spec = _analyze(field, hints[field.name], dtype)
            self._specs[field.name] = spec
            self._add_option(group, spec)

    @staticmethod
    def _add_option(group, spec: _FieldSpec) -> None:
        # Defaults are SUPPRESSed: the namespace then holds only what the user typed, which is what lets
        # command-line options override a config file without the file's keys being reset to defaults.
        kwargs: Dict[str, Any] = {"default": argparse.SUPPRESS, "help": _help_text(spec), "dest": spec.name}
        if spec.kind == "bool":
            kwargs.update(type=_cli_bool, nargs="?", const=True, metavar="{true,false}")
        elif spec.kind == "list":
            kwargs.update(type=spec.base, nargs="+")
        elif spec.kind == "list_of_lists":
            kwargs.update(type=spec.base, nargs="+", action="append")
        elif spec.kind == "dict":
            kwargs.update(type=json_object)
        else:
            kwargs.update(type=spec.base)
        if spec.choices is not None and spec.kind in ("choice", "list"):
            kwargs["choices"] = spec.choices
        group.add_argument(f"--{spec.name}", **kwargs)
        if spec.kind == "bool" and spec.default is True:
            group.add_argument(
                f"--no_{spec.name}", action="store_false", dest=spec.name, default=argparse.SUPPRESS,
                help=f"Set {spec.name} to False.",
            )

    # ---------------------------------------------------------------- usage errors
    def error(self, message: str):
        """argparse's error path (usage, ``<prog>: error: <message>``, exit 2) with a one-line usage: the full one
        lists every option of every dataclass (hundreds for ``TrainingArguments``) and would bury the error.
        Non-UTF-8 input (lone surrogates) is shown backslash-escaped, so any stderr can print the message."""
        message = message.encode("utf-8", "backslashreplace").decode("utf-8")
        if self.usage is not None or len(self._specs) <= 20:
            super().error(message)
        sys.stderr.write(f"usage: {self.prog} [-h] [--option VALUE ...]  ({self.prog} --help lists all "
                         f"{len(self._specs)} options)\n")
        self.exit(2, f"{self.prog}: error: {message}\n")

    def _usage_error(self, message: str):
        """End like argparse does for a bad option (usage, ``error: ...``, exit 2), or raise ``ValueError`` when
        the parser was built with ``exit_on_error=False``."""
        if not self.exit_on_error:
            raise ValueError(message)
        self.error(message)

    def _as_usage_error(self, err: Exception, source: str, given) -> None:
        """Turn a dataclass's ``ValueError`` into a usage error naming the option it is about.

        The dataclasses' checks name the options they refuse (``warmup_ratio=2.0 is invalid: ...``,
        ``tensor_parallel_degree=1 x pipeline_parallel_degree=4 = 4 does not divide ...``): the option named is the
        first of those the user gave (``given``), then an alias the user gave of one named (a dataclass's
        ``_option_aliases``, alias → option: ``tensor_model_parallel_size`` sets ``tensor_parallel_degree``), else the
        first named at all.
        """
        message = str(err)
        if isinstance(err, _OptionValueError):  # the message already says where the value came from
            self._usage_error(f"argument --{err.option}: {message}")
        named = [n for n in re.findall(r"[A-Za-z_][A-Za-z0-9_]*", message) if n in self._specs]
        aliases = [(a, t) for d in self.dataclass_types for a, t in getattr(d, "_option_aliases", {}).items()]
        given_named = [n for n in named if n in given] + [a for n in named for a, t in aliases if t == n and a in given]
        option = next(iter(given_named), named[0] if named else None)
        where = "" if source == "command line" else f" (in {source})"
        self._usage_error(f"argument --{option}: {message}{where}" if option else f"{message}{where}")

    # ---------------------------------------------------------------- the one place values become dataclasses
    def _build(self, values: Dict[str, Any], source: str, allow_extra_keys: bool = False,
               usage_errors: bool = False) -> List[Any]:
        """Values → dataclass instances. ``usage_errors``: bad input ends as a usage error (see the module doc)."""
        try:
            return self._build_or_raise(values, source, allow_extra_keys)
        except ValueError as err:
            if not usage_errors:
                raise
            self._as_usage_error(err, source, values)

    def _build_or_raise(self, values: Dict[str, Any], source: str, allow_extra_keys: bool) -> List[Any]:
        unknown = [k for k in values if k not in self._specs]
        if unknown and not allow_extra_keys:
            raise ValueError(f"{source}: {_unknown_message(unknown, self._specs)}")
        missing = [f"--{s.name}" for s in self._specs.values() if s.required and s.name not in values]
        if missing:
            raise ValueError(f"{source}: missing required option(s): {', '.join(missing)}")
        kwargs_by_type: Dict[type, Dict[str, Any]] = {dtype: {} for dtype in self.dataclass_types}
        for name, value in values.items():
            spec = self._specs.get(name)
            if spec is None:
                continue
            try:
                kwargs_by_type[spec.owner][name] = _coerce(spec, value)
            except ValueError:
                raise _OptionValueError(
                    name, f"{source}: invalid value for {name}: {value!r} (expected {_expected(spec)})"
                ) from None
        return [dtype(**kwargs_by_type[dtype]) for dtype in self.dataclass_types]

    def _cli_values(self, args: List[str]) -> Tuple[Dict[str, Any], argparse.Namespace, List[str]]:
        """Parse ``args``: (dataclass values given, namespace of other arguments, unrecognised strings)."""
        namespace, remaining = self.parse_known_args(args=args)
        values = {k: v for k, v in vars(namespace).items() if k in self._specs}
        for key in values:
            delattr(namespace, key)
        return values, namespace, remaining

    def _finish(self, outputs, namespace, remaining, return_remaining_strings):
        if vars(namespace):
            outputs.append(namespace)
        if return_remaining_strings:
            return (*outputs, remaining)
        if remaining:
            self._usage_error(f"command line: {_unknown_message(remaining, self._specs, cli=True)}")
        return tuple(outputs)

    # ---------------------------------------------------------------- public entry points
    def parse_args_into_dataclasses(
        self,
        args: Optional[List[str]] = None,
        return_remaining_strings: bool = False,
        look_for_args_file: bool = True,
        args_filename: Optional[str] = None,
    ) -> Tuple[Any, ...]:
        """Parse command-line strings (default ``sys.argv[1:]``) into dataclass instances.

        With ``look_for_args_file`` a file named like the script with suffix ``.args`` (or ``args_filename``)
        is read first; its options come before the command line's, so the command line wins. Unknown options
        raise ``ValueError`` unless ``return_remaining_strings``, which appends them to the result.
        """
        if args_filename or (look_for_args_file and sys.argv):
            args_file = Path(args_filename) if args_filename else Path(sys.argv[0]).with_suffix(".args")
            if args_file.exists():
                file_args = self._read_text(args_file)
                args = file_args.split() + (list(args) if args is not None else sys.argv[1:])
        values, namespace, remaining = self._cli_values(args)
        outputs = self._build(values, "command line", usage_errors=True)
        return self._finish(outputs, namespace, remaining, return_remaining_strings)

    def parse_dict(self, args: Dict[str, Any], allow_extra_keys: bool = False) -> Tuple[Any, ...]:
        """Build the dataclasses from a dict (keys are field names); unknown keys raise unless allowed."""
        return tuple(self._build(dict(args), "dict", allow_extra_keys))

    def parse_json_file(
        self, json_file: str, return_remaining_strings: bool = False, allow_extra_keys: bool = False
    ) -> Tuple[Any, ...]:
        """Build the dataclasses from a JSON object file.

        As in PaddleNLP, ``return_remaining_strings=True`` returns unknown keys (as ``--key value`` strings)
        instead of raising.
        """
        data = self._load_file(json_file, "json")
        if return_remaining_strings:
            extra = {k: v for k, v in data.items() if k not in self._specs}
            outputs = self._build(data, str(json_file), allow_extra_keys=True, usage_errors=True)
            return (*outputs, _as_cli_strings(extra))
        return tuple(self._build(data, str(json_file), allow_extra_keys, usage_errors=True))

    def parse_yaml_file(self, yaml_file: str, allow_extra_keys: bool = False) -> Tuple[Any, ...]:
        """Build the dataclasses from a YAML mapping file."""
        return tuple(self._build(self._load_file(yaml_file, "yaml"), str(yaml_file), allow_extra_keys,
                                 usage_errors=True))

    def parse_json_file_and_cmd_lines(self, return_remaining_strings: bool = False) -> Tuple[Any, ...]:
        """``python script.py config.json --opt value ...``: the JSON file, then command-line overrides."""
        return self._parse_file_and_cmd_lines("json", (".json",), return_remaining_strings)

    def parse_yaml_file_and_cmd_lines(self, return_remaining_strings: bool = False) -> Tuple[Any, ...]:
        """``python script.py config.yaml --opt value ...``: the YAML file, then command-line overrides."""
        return self._parse_file_and_cmd_lines("yaml", (".yaml", ".yml"), return_remaining_strings)

    def _parse_file_and_cmd_lines(self, fmt, suffixes, return_remaining_strings):
        if len(sys.argv) < 2 or not sys.argv[1].endswith(suffixes):
            got = sys.argv[1] if len(sys.argv) > 1 else "nothing"
            self._usage_error(f"the first command-line argument must be a {'/'.join(suffixes)} file, got {got}")
        path = sys.argv[1]
        file_values = self._load_file(path, fmt)
        unknown = [k for k in file_values if k not in self._specs]
        if unknown:
            self._usage_error(f"{path}: {_unknown_message(unknown, self._specs)}")
        cli_values, namespace, remaining = self._cli_values(sys.argv[2:])
        outputs = self._build({**file_values, **cli_values}, f"{path} + command line", usage_errors=True)
        return self._finish(outputs, namespace, remaining, return_remaining_strings)

    def _load_file(self, path, fmt: str) -> Dict[str, Any]:
        return _load_file(self._read_text(path), path, fmt, self._usage_error)

    def _read_text(self, path) -> str:
        """A config or ``.args`` file's text; a missing, unreadable, non-UTF-8 file or a directory is a usage error."""
        try:
            return Path(path).read_text(encoding="utf-8")
        except UnicodeDecodeError as err:
            self._usage_error(f"{path}: not UTF-8 text (byte {err.object[err.start]:#04x} at offset {err.start})")
        except OSError as err:  # names the path: No such file or directory, Is a directory, Permission denied
            self._usage_error(f"{path}: {err.strerror or err}")


def _cli_bool(text: str) -> bool:
    try:
        return strtobool(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def _load_file(text: str, path, fmt: str, fail) -> Dict[str, Any]:
    """The option mapping of a JSON/YAML file's ``text``; ``fail(message)`` reports bad content (it does not return)."""
    try:
        if fmt == "json":
            data = json.loads(text)
        else:
            import yaml  # only needed for YAML configs

            try:
                data = yaml.safe_load(text) or {}
            except yaml.YAMLError as err:
                raise ValueError(f"not valid YAML: {err}".replace("\n", " ")) from None
    except ValueError as err:
        fail(f"{path}: {err}")
    except RecursionError:  # the parsers recurse once per nesting level
        fail(f"{path}: nested too deeply to be a configuration")
    if not isinstance(data, dict):
        fail(f"{path}: the top level must be a mapping of option names to values")
    keys = [k for k in data if not isinstance(k, str)]
    if keys:
        fail(f"{path}: option names must be text, got {keys[0]!r}")
    return data


def _unknown_message(unknown: List[str], specs: Dict[str, _FieldSpec], cli: bool = False) -> str:
    parts = []
    for item in unknown:
        name = item.lstrip("-").split("=", 1)[0] if cli else item
        close = difflib.get_close_matches(name, list(specs), n=1)
        parts.append(f"{item} (did you mean {close[0]}?)" if close else str(item))
    owners = ", ".join(dict.fromkeys(s.owner.__name__ for s in specs.values()))
    return f"unknown option(s) {', '.join(parts)}; not a field of {owners}"


def _as_cli_strings(values: Dict[str, Any]) -> List[str]:
    strings: List[str] = []
    for key, value in values.items():
        items = value if isinstance(value, list) else [json.dumps(value) if isinstance(value, dict) else value]
        strings.extend([f"--{key}", *[str(v) for v in items]])
    return strings
