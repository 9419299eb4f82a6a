"""What a checkpoint's JSON files may hold, one schema per kind of file, checked when the file is loaded.

A file can have a matching size and crc32 in the index and still hold nonsense (whoever can edit a file can edit
the index, and a bug can write it): ``global_step: -5`` would train extra steps, ``consumed_samples: 1e30`` would
end training at once, a file name ``../../x`` would read bytes from outside the checkpoint. Every field is checked
against its schema before anything uses it, and the first bad one raises :class:`InvalidCheckpointFileError`:
``<file>: field <name>: <what is wrong>; valid: <what would be>``.

A schema is built from small checks (:class:`Int`, :class:`Num`, :class:`Str`, :class:`ListOf`,
:class:`DictOf`, :class:`Record`, ...), each of which knows how to describe what it accepts. Cross-field rules
(a piece's file must be in the index's file table, a piece must lie inside its tensor) are checked by the
kind's own function after its record.
"""

from __future__ import annotations

import json
import math
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from ..errors import CheckpointError
from .placement import FORMAT_NAME, FORMAT_VERSION, HEADER_PART

__all__ = ["InvalidCheckpointFileError", "plain_name_problem", "validate_index", "validate_trainer_state",
           "validate_data_state", "validate_batch_args", "validate_scheduler_state", "validate_scaler_state",
           "validate_rng_doc", "safetensors_entries"]

INT64_MAX = 2 ** 63 - 1
UINT32_MAX = 2 ** 32 - 1
UINT64_MAX = 2 ** 64 - 1
# the dtype names an index records (Paddle's names of what safetensors can hold; bfloat16 stored as its bits)
INDEX_DTYPES = ("bfloat16", "bool", "float16", "float32", "float64", "int16", "int32", "int64", "int8",
                "uint16", "uint32", "uint64", "uint8")
# safetensors dtype codes and their item sizes (https://github.com/huggingface/safetensors, "Format")
SAFETENSORS_ITEMSIZE = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1,
                        "U64": 8, "U32": 4, "U16": 2, "U8": 1, "BOOL": 1}


class InvalidCheckpointFileError(CheckpointError):
    """A checkpoint file is readable but holds a value that is not valid; ``file`` and ``field`` name it."""

    def __init__(self, file: str, field: str, what: str):
        self.file, self.field, self.what = file, field, what
        super().__init__(f"{file}: field {field}: {what}" if field else f"{file}: {what}")


class _Invalid(Exception):
    """Raised by the checks, caught by :func:`check_document`, which adds the file name."""

    def __init__(self, field: str, what: str):
        super().__init__(field, what)
        self.field, self.what = field, what


def _show(value: Any) -> str:
    """A short rendering of a bad value, with its JSON type where the text alone would hide it."""
    if isinstance(value, bool) or value is None:
        return json.dumps(value)
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return f"{value!r} (a float)"
    if isinstance(value, str):
        text = json.dumps(value)
        return (text if len(text) <= 60 else text[:57] + '..."') + " (a string)"
    return {list: "a list", dict: "an object"}.get(type(value), type(value).__name__)


def _range(lo, hi) -> str:
    if lo is not None and hi is not None:
        return f"in [{lo}, {hi}]"
    return f">= {lo}" if lo is not None else (f"<= {hi}" if hi is not None else "")


class Check:
    """One rule for a value; ``valid`` says what it accepts (the second half of every message)."""

    valid = "anything"

    def __call__(self, value: Any, field: str) -> None:
        raise NotImplementedError

    def bad(self, value: Any, field: str, why: str = "") -> _Invalid:
        return _Invalid(field, f"{_show(value)}{' ' + why if why else ''} is not valid; valid: {self.valid}")


class Int(Check):
    def __init__(self, lo: Optional[int] = None, hi: Optional[int] = None):
        self.lo, self.hi = lo, hi
        self.valid = f"an integer {_range(lo, hi)}".rstrip()

    def __call__(self, value, field):
        if isinstance(value, bool) or not isinstance(value, int):
            raise self.bad(value, field)
        if (self.lo is not None and value < self.lo) or (self.hi is not None and value > self.hi):
            raise self.bad(value, field)


class Num(Check):
    """A number (int or float, not a boolean), finite unless told otherwise."""

    def __init__(self, lo: Optional[float] = None, hi: Optional[float] = None, finite: bool = True):
        self.lo, self.hi, self.finite = lo, hi, finite
        self.valid = f"a {'finite ' if finite else ''}number {_range(lo, hi)}".rstrip()

    def __call__(self, value, field):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or (self.finite and not math.isfinite(value)):
            raise self.bad(value, field)
        if (self.lo is not None and value < self.lo) or (self.hi is not None and value > self.hi):
            raise self.bad(value, field)


class Bool(Check):
    valid = "true or false"

    def __call__(self, value, field):
        if not isinstance(value, bool):
            raise self.bad(value, field)


class Str(Check):
    def __init__(self, choices: Optional[Sequence[str]] = None, rule: Optional[Callable[[str], Optional[str]]] = None,
                 valid: str = "a string"):
        self.choices, self.rule = choices, rule
        self.valid = f"one of {', '.join(map(repr, choices))}" if choices else valid

    def __call__(self, value, field):
        if not isinstance(value, str) or (self.choices and value not in self.choices):
            raise self.bad(value, field)
        problem = self.rule(value) if self.rule else None
        if problem:
            raise _Invalid(field, f"{_show(value)} {problem}; valid: {self.valid}")


class Null(Check):
    """``inner`` or null."""

    def __init__(self, inner: Check):
        self.inner = inner
        self.valid = f"null or {inner.valid}"

    def __call__(self, value, field):
        if value is not None:
            self.inner(value, field)


class ListOf(Check):
    def __init__(self, item: Check, length: Optional[int] = None, min_len: int = 0, max_len: Optional[int] = None):
        self.item, self.length, self.min_len, self.max_len = item, length, min_len, max_len
        count = f"{length} " if length is not None else (f"at least {min_len} " if min_len else "")
        self.valid = f"a list of {count}items, each {item.valid}"

    def __call__(self, value, field):
        if not isinstance(value, list):
            raise self.bad(value, field)
        n = len(value)
        if (self.length is not None and n != self.length) or n < self.min_len or (self.max_len and n > self.max_len):
            raise _Invalid(field, f"a list of {n} items is not valid; valid: {self.valid}")
        for i, item in enumerate(value):
            self.item(item, f"{field}[{i}]")


class DictOf(Check):
    """An object whose keys pass ``key`` (a :class:`Str`) and values pass ``value``."""

    def __init__(self, value: Check, key: Check = Str()):
        self.key, self.value = key, value
        self.valid = f"an object of {value.valid}"

    def __call__(self, value, field):
        if not isinstance(value, dict):
            raise self.bad(value, field)
        for k, v in value.items():
            self.key(k, f"{field}[{k!r}]")
            self.value(v, f"{field}[{k!r}]")


class Any_(Check):
    """Any JSON value (for free-form fields: log entries, trial parameters)."""

    def __call__(self, value, field):
        return None


class Record(Check):
    """An object with named fields: ``fields[name] = (check, required)``; unknown keys pass ``extra`` (None:
    kept as they are, e.g. a newer version's fields)."""

    def __init__(self, fields: Dict[str, Tuple[Check, bool]], extra: Optional[Check] = None):
        self.fields, self.extra = fields, extra
        self.valid = "an object with " + ", ".join(self.fields)

    def __call__(self, value, field):
        if not isinstance(value, dict):
            raise self.bad(value, field)
        prefix = f"{field}." if field else ""
        for name, (check, required) in self.fields.items():
            if name in value:
                check(value[name], prefix + name)
            elif required:
                raise _Invalid(prefix + name, f"missing; valid: {check.valid}")
        if self.extra is not None:
            for name in value:
                if name not in self.fields:
                    self.extra(value[name], prefix + name)


def check_document(doc: Any, schema: Check, source: str, after: Optional[Callable[[Any], None]] = None) -> Any:
    """``doc`` when it passes ``schema`` (then ``after``, the kind's cross-field rules); else
    :class:`InvalidCheckpointFileError` naming ``source`` and the first bad field."""
    try:
        schema(doc, "")
        if after is not None:
            after(doc)
    except _Invalid as e:
        if not e.field:
            raise InvalidCheckpointFileError(source, "", f"is {_show(doc)}, not {schema.valid}") from None
        raise InvalidCheckpointFileError(source, e.field, e.what) from None
    return doc


# ------------------------------------------------------------------------------------------ file names
def plain_name_problem(name: Any) -> Optional[str]:
    """Why ``name`` is not a plain file name (one path component, inside the directory it is joined to), or None."""
    if not isinstance(name, str) or not name:
        return "is not a file name"
    if name in (".", "..") or "/" in name or "\\" in name or "\x00" in name:
        return "is not a plain file name (a name inside the checkpoint directory: no '/', '..' or absolute path)"
    return None


FILE_NAME = Str(rule=plain_name_problem, valid="a plain file name inside the checkpoint directory")


# ------------------------------------------------------------------------------------------- the index
_FILE_RECORD = Record({"size": (Int(0, INT64_MAX), True), "crc32": (Int(0, UINT32_MAX), True),
                       "parts": (DictOf(Int(0, UINT32_MAX)), False)})
_DIMS = ListOf(Int(0, INT64_MAX), max_len=64)
_PIECE = Record({"file": (FILE_NAME, True), "key": (Str(), False), "offsets": (_DIMS, True), "shape": (_DIMS, True),
                 "flat": (ListOf(Int(0, INT64_MAX), length=2), False)})
_TENSOR = Record({"shape": (_DIMS, True), "dtype": (Str(INDEX_DTYPES), True),
                  "pieces": (ListOf(_PIECE, min_len=1), True)})
# the writing layout (``Layout.as_dict``: world_size and the axes' degrees); it decides whether RNG states are
# restored, and how many data ranks an old checkpoint without a recorded global batch was trained with
_LAYOUT = DictOf(Int(1, INT64_MAX))
# ``checkpoint.peft.index_entry``: merge_checkpoint.py computes LoRA's scaling lora_alpha / r (or / sqrt(r)) from it
_LORA_CONFIG = Record({"r": (Int(1, INT64_MAX), True), "lora_alpha": (Num(), True), "rslora": (Bool(), False)})
_PEFT = Record({"type": (Str(["lora"]), True), "config": (_LORA_CONFIG, True), "base_architecture": (Str(), False)})
INDEX_SCHEMA = Record({
    "format": (Str([FORMAT_NAME]), True),
    "version": (Int(1, FORMAT_VERSION), False),  # optional, as it always was: readers take a missing one as old
    "topology": (_LAYOUT, False),
    "peft": (_PEFT, False),
    "files": (DictOf(_FILE_RECORD, key=FILE_NAME), True),
    "tensors": (DictOf(_TENSOR), True),
    "rng_files": (Bool(), False),
})


def _index_consistency(index: dict) -> None:
    for key, t in index["tensors"].items():
        for i, p in enumerate(t["pieces"]):
            field = f"tensors[{key!r}].pieces[{i}]"
            if p["file"] not in index["files"]:
                raise _Invalid(f"{field}.file", f"{p['file']!r} is not in the index's files; valid: one of its files")
            if len(p["offsets"]) != len(t["shape"]) or len(p["shape"]) != len(t["shape"]) or any(
                    o + s > g for o, s, g in zip(p["offsets"], p["shape"], t["shape"])):
                raise _Invalid(field, f"box {p['offsets']}+{p['shape']} is not valid; valid: a box inside the "
                                      f"tensor's shape {t['shape']}")
            flat = p.get("flat")
            if flat is not None and not flat[0] <= flat[1] <= math.prod(p["shape"]):
                raise _Invalid(f"{field}.flat", f"{flat} is not valid; valid: [start, stop] with 0 <= start <= stop "
                                                f"<= {math.prod(p['shape'])} (the piece's element count)")
    for name, meta in index["files"].items():
        if set(meta.get("parts", ())) - {HEADER_PART} and HEADER_PART not in meta["parts"]:
            raise _Invalid(f"files[{name!r}].parts",
                           f"has tensor checksums but no {HEADER_PART!r}; valid: both or none")


def validate_index(index: Any, source: str) -> dict:
    """The parsed ``checkpoint_index.json`` when it is one this code can read; else the error naming the field."""
    if isinstance(index, dict) and isinstance(index.get("version"), int) and not isinstance(index["version"], bool) \
            and index["version"] > FORMAT_VERSION and index.get("format") == FORMAT_NAME:
        raise InvalidCheckpointFileError(source, "version", f"{index['version']} is newer than this paddletrainer "
                                                            f"reads; valid: 1 to {FORMAT_VERSION} (load the checkpoint "
                                                            "with the newer paddletrainer that wrote it)")
    return check_document(index, INDEX_SCHEMA, source, _index_consistency)


# --------------------------------------------------------------------------- trainer state, data position
_STEPS = Int(0, INT64_MAX)
TRAINER_STATE_SCHEMA = Record({
    "epoch": (Null(Num(0)), False),
    "global_step": (_STEPS, False),  # free-form for save_checkpoint's callers; a resume requires it
    "consumed_samples": (_STEPS, False),  # older states keep it in data_state.json only
    "skipped_steps": (_STEPS, False),
    "max_steps": (Int(-1, INT64_MAX), False),
    "num_train_epochs": (Num(0), False),
    "total_flos": (Num(0), False),
    "log_history": (ListOf(DictOf(Any_())), False),
    "best_metric": (Null(Num(finite=False)), False),  # an evaluation can report nan
    "best_model_checkpoint": (Null(Str()), False),
    "is_local_process_zero": (Bool(), False),
    "is_world_process_zero": (Bool(), False),
    "trial_name": (Null(Str()), False),
    "trial_params": (Null(DictOf(Any_())), False),
})
RESUME_STATE_SCHEMA = Record({**TRAINER_STATE_SCHEMA.fields, "global_step": (_STEPS, True)})
# global_batch_size: written since the resume keeps it; a resume derives gradient_accumulation_steps from it
DATA_STATE_SCHEMA = Record({"consumed_samples": (_STEPS, True), "global_batch_size": (Int(1, INT64_MAX), False)})


def validate_trainer_state(doc: Any, source: str, resume: bool = False) -> dict:
    """``trainer_state.json``: the fields of ``TrainerState`` that it holds, each of its type and range; unknown
    keys pass (``TrainerState.from_dict`` drops them). ``resume``: the Trainer resumes from it, so a state
    that is not empty (``{}``: saved without a Trainer state) must hold ``global_step``."""
    if resume and doc == {}:
        return doc
    return check_document(doc, RESUME_STATE_SCHEMA if resume else TRAINER_STATE_SCHEMA, source)


# the two training arguments an old checkpoint's global batch is computed from (the other arguments are not read)
BATCH_ARGS_SCHEMA = Record({"per_device_train_batch_size": (Int(1, INT64_MAX), False),
                            "gradient_accumulation_steps": (Int(1, INT64_MAX), False)})


def validate_batch_args(doc: Any, source: str) -> dict:
    """``training_args.json`` as far as a resume reads it: the per-device batch and the accumulation steps."""
    return check_document(doc, BATCH_ARGS_SCHEMA, source)


def validate_data_state(doc: Any, source: str) -> dict:
    """``data_state.json``: the data position and the global batch it is counted in,
    ``{"consumed_samples": n, "global_batch_size": b}`` (``b`` absent in older checkpoints)."""
    return check_document(doc, DATA_STATE_SCHEMA, source)


# ----------------------------------------------------------------------------------- scheduler, scaler
# the fields every Paddle LRScheduler saves; subclasses add their own (ReduceOnPlateau's ``best`` starts at inf,
# LinearWarmup nests its inner scheduler's state), which their ``set_state_dict`` reads
SCHEDULER_SCHEMA = Record({"last_epoch": (Int(-1, INT64_MAX), True), "last_lr": (Num(), True)})


class _Scale(Check):
    """The loss scale as :func:`.write.jsonable` stores the scaler's 1-element tensor."""

    valid = 'a 1-element array {"__ndarray__": [s], "dtype": "float32"} with s > 0'
    _form = Record({"__ndarray__": (ListOf(Num(0), length=1), True), "dtype": (Str(["float32", "float64"]), True)})

    def __call__(self, value, field):
        self._form(value, field)
        if not value["__ndarray__"][0] > 0:
            raise self.bad(value["__ndarray__"][0], f"{field}.__ndarray__[0]")


SCALER_SCHEMA = Record({
    "scale": (_Scale(), True), "incr_ratio": (Num(1), True), "decr_ratio": (Num(0, 1), True),
    "incr_every_n_steps": (Int(1, INT64_MAX), True), "decr_every_n_nan_or_inf": (Int(1, INT64_MAX), True),
    "incr_count": (Int(0, INT64_MAX), True), "decr_count": (Int(0, INT64_MAX), True),
    "use_dynamic_loss_scaling": (Bool(), True),
})


def validate_scheduler_state(doc: Any, source: str) -> dict:
    """``scheduler.json`` (a Paddle LR scheduler's ``state_dict``)."""
    return check_document(doc, SCHEDULER_SCHEMA, source)


def validate_scaler_state(doc: Any, source: str) -> dict:
    """``scaler.json`` (Paddle's ``GradScaler.state_dict``; ``{}`` for a disabled scaler)."""
    if doc == {}:
        return doc
    return check_document(doc, SCALER_SCHEMA, source)


# ------------------------------------------------------------------------------------------------ RNG
def _engine_text(text: str) -> Optional[str]:
    words = text.split()
    if not words or len(words) > 1024 or not all(w.isascii() and w.isdigit() and int(w) <= UINT64_MAX for w in words):
        return "is not a Paddle generator engine state"
    return None


_GENERATOR = Record({"device": (Int(-1, 1 << 16), True), "seed": (Int(0, UINT64_MAX), True),
                     "offset": (Int(0, UINT64_MAX), True),
                     "engine": (Str(rule=_engine_text, valid="its engine's numbers as text (up to 1024 words)"), True)})
_MT_WORD = Int(0, UINT32_MAX)


def rng_schema(fmt: str) -> Record:
    """The schema of :mod:`.rng`'s JSON (format ``fmt``): Mersenne Twister states of python's ``random``
    (624 words + position) and numpy (624 words), Paddle's generator states."""
    return Record({
        "format": (Str([fmt]), True),
        "python": (Record({"version": (Int(3, 3), True), "state": (ListOf(_MT_WORD, length=625), True),
                           "gauss_next": (Null(Num()), True)}), True),
        "numpy": (Record({"algorithm": (Str(["MT19937"]), True), "keys": (ListOf(_MT_WORD, length=624), True),
                          "pos": (Int(0, 624), True), "has_gauss": (Int(0, 1), True),
                          "cached_gaussian": (Num(), True)}), True),
        "paddle": (ListOf(_GENERATOR, min_len=1), True),
        "tracker": (DictOf(ListOf(_GENERATOR, min_len=1)), True),
    })


def _mt_position(doc: dict) -> None:
    if doc["python"]["state"][-1] > 624:
        raise _Invalid("python.state[624]", f"{doc['python']['state'][-1]} is not valid; valid: the position, 0 to 624")


def validate_rng_doc(doc: Any, source: str, fmt: str) -> dict:
    """A parsed ``rng_state.<coords>.json``."""
    return check_document(doc, rng_schema(fmt), source, _mt_position)


# ---------------------------------------------------------------------------------- safetensors headers
_ST_ENTRY = Record({"dtype": (Str(list(SAFETENSORS_ITEMSIZE)), True), "shape": (_DIMS, True),
                    "data_offsets": (ListOf(Int(0, INT64_MAX), length=2), True)})


def safetensors_entries(text: bytes, data_size: int) -> Tuple[dict, List[Tuple[str, dict]]]:
    """The header of a safetensors file and its tensors ``(key, meta)`` in file order, each inside the
    ``data_size`` bytes after the header, sized by its dtype and shape, one after the other; raises
    ``ValueError`` saying what is wrong (before anything is allocated from the header's numbers)."""
    try:
        header = json.loads(text)
    except (UnicodeDecodeError, ValueError) as e:
        raise ValueError(f"header is not JSON ({e})") from None
    if not isinstance(header, dict):
        raise ValueError("header is not a JSON object")
    entries = []
    try:
        for key, meta in header.items():
            if key == "__metadata__":
                continue
            _ST_ENTRY(meta, key)
            begin, end = meta["data_offsets"]
            if not begin <= end <= data_size:
                raise _Invalid(f"{key}.data_offsets", f"{meta['data_offsets']} is not valid; valid: inside the "
                                                      f"{data_size} data bytes of the file")
            if end - begin != math.prod(meta["shape"]) * SAFETENSORS_ITEMSIZE[meta["dtype"]]:
                raise _Invalid(key, f"{end - begin} bytes do not hold {meta['dtype']} {meta['shape']}")
            entries.append((key, meta))
        entries.sort(key=lambda kv: kv[1]["data_offsets"][0])
        pos = 0
        for key, meta in entries:  # the format's rule: no holes, no overlaps, so their sum fits in the file
            if meta["data_offsets"][0] != pos:
                raise _Invalid(f"{key}.data_offsets", f"{meta['data_offsets']} is not valid; valid: starting at "
                                                      f"{pos}, where the tensor before it ends")
            pos = meta["data_offsets"][1]
    except _Invalid as e:
        raise ValueError(f"header field {e.field}: {e.what}") from None
    return header, entries
