"""A small declarative validator for TOML documents.

Calibration and workload files are validated against a tree of
:class:`Table` and :class:`Field` specs. The first problem found raises
:class:`~sdplan.errors.InputFileError` with the file, the dotted key path and
what is expected, so every message reads
``<file>: <key>: <problem>; <fix>``.
"""

from __future__ import annotations

import datetime as _dt
import difflib
import math
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sdplan.errors import InputFileError

if sys.version_info >= (3, 11):
    import tomllib
else:  # Python 3.10: tomllib's parser as the tomli package (a dependency there)
    import tomli as tomllib

_TYPE_NAMES = {
    "float": "a number",
    "int": "an integer",
    "str": "a string",
    "bool": "true or false",
    "date": "a date (YYYY-MM-DD)",
    "float_list": "an array of numbers",
    "str_list": "an array of strings",
    "float_matrix": "a square array of arrays of numbers",
    "range": "an array of two numbers [min, max]",
}


@dataclass(frozen=True, slots=True)
class Field:
    """One scalar or array key.

    ``kind`` is one of the keys of ``_TYPE_NAMES``. ``minimum``/``maximum``
    are inclusive bounds on numbers (each element for arrays); every number
    must be finite.
    """

    kind: str
    doc: str
    required: bool = True
    minimum: float | None = None
    maximum: float | None = None
    choices: tuple[str, ...] | None = None


@dataclass(frozen=True, slots=True)
class Table:
    """A TOML table whose keys are all known."""

    fields: Mapping[str, Field | Table]
    doc: str = ""
    required: bool = True
    extra: dict[str, Any] = field(default_factory=dict)


_BOMS = ((b"\xef\xbb\xbf", "utf-8"), (b"\xff\xfe\x00\x00", "utf-32-le"), (b"\x00\x00\xfe\xff", "utf-32-be"),
         (b"\xff\xfe", "utf-16-le"), (b"\xfe\xff", "utf-16-be"))


def decode_text(raw: bytes, path: str, kind: str) -> str:
    """Text of a file: UTF-8, or any UTF with a byte-order mark (which is dropped).

    Raises
    ------
    InputFileError
        If the bytes are not valid in that encoding (e.g. latin-1 or UTF-16
        without a mark), or hold NUL characters.
    """
    encoding = "utf-8"
    for mark, name in _BOMS:
        if raw.startswith(mark):
            raw, encoding = raw[len(mark):], name
            break
    try:
        text = raw.decode(encoding)
    except UnicodeDecodeError as error:
        raise InputFileError(path, None, f"not UTF-8 text (byte {error.start}: {raw[error.start:error.start + 1]!r}); "
                             f"save the file as UTF-8 {kind}") from None
    if "\x00" in text:
        raise InputFileError(path, None, f"holds NUL characters (binary, or UTF-16 without a byte-order mark); "
                             f"save the file as UTF-8 {kind}")
    return text


def read_toml(path: Path) -> dict[str, Any]:
    """Parse a TOML file; any read or syntax problem becomes an :class:`InputFileError`.

    A UTF-8 byte-order mark (as some Windows editors write) is accepted, and
    so is UTF-16/32 with a mark; other encodings are refused with a message.
    """
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise InputFileError(str(path), None, "no such file; check the path") from None
    except IsADirectoryError:
        raise InputFileError(str(path), None, "is a directory; pass a TOML file") from None
    except PermissionError:
        raise InputFileError(str(path), None, "permission denied; make the file and its folders readable") from None
    except OSError as exc:
        raise InputFileError(str(path), None, f"cannot read ({exc.strerror}); check the path") from None
    text = decode_text(raw, str(path), "TOML")
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise InputFileError(str(path), None, f"invalid TOML ({exc}); fix the syntax") from None
    except RecursionError:
        raise InputFileError(str(path), None, "nested too deeply to be a calibration or workload file") from None


def validate(document: Mapping[str, Any], spec: Table, path: str, prefix: str = "") -> None:
    """Check ``document`` against ``spec``; raise on the first problem."""
    for key in document:
        if key not in spec.fields:
            dotted = f"{prefix}{key}"
            close = difflib.get_close_matches(key, list(spec.fields), n=1)
            hint = f"did you mean '{prefix}{close[0]}'?" if close else _allowed(spec, prefix)
            raise InputFileError(path, dotted, f"unknown key; {hint}")
    for key, sub in spec.fields.items():
        dotted = f"{prefix}{key}"
        if key not in document:
            if sub.required and isinstance(sub, Table):
                raise InputFileError(path, dotted, f"missing; add the table [{dotted}]")
            if sub.required:
                assert isinstance(sub, Field)
                raise InputFileError(path, dotted, f"missing; add it ({_TYPE_NAMES[sub.kind]}: {sub.doc})")
            continue
        value = document[key]
        if isinstance(sub, Table):
            if not isinstance(value, dict):
                raise InputFileError(path, dotted, f"expected a table [{dotted}], got {_describe(value)}")
            validate(value, sub, path, f"{dotted}.")
        else:
            _check_field(value, sub, path, dotted)


def _allowed(spec: Table, prefix: str) -> str:
    names = ", ".join(f"'{prefix}{name}'" for name in spec.fields)
    return f"allowed keys here: {names}"


def _describe(value: Any) -> str:
    if isinstance(value, bool):
        return f"boolean {str(value).lower()}"
    if isinstance(value, dict):
        return "a table"
    if isinstance(value, list):
        return "an array"
    if isinstance(value, str):
        return f'string "{value[:60]}{"..." if len(value) > 60 else ""}"'
    text = repr(value)
    return f"{type(value).__name__} {text[:60]}{'...' if len(text) > 60 else ''}"


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _check_number(value: Any, spec: Field, path: str, key: str) -> None:
    if not _is_number(value):
        raise InputFileError(path, key, f"expected a number ({spec.doc}), got {_describe(value)}")
    if not math.isfinite(value):
        raise InputFileError(path, key, f"must be finite, got {value}; give a real number ({spec.doc})")
    if spec.minimum is not None and value < spec.minimum:
        raise InputFileError(path, key, f"must be >= {spec.minimum:g}, got {value:g} ({spec.doc})")
    if spec.maximum is not None and value > spec.maximum:
        raise InputFileError(path, key, f"must be <= {spec.maximum:g}, got {value:g} ({spec.doc})")


def _check_field(value: Any, spec: Field, path: str, key: str) -> None:
    kind = spec.kind
    if kind == "float":
        _check_number(value, spec, path, key)
    elif kind == "int":
        if not isinstance(value, int) or isinstance(value, bool):
            raise InputFileError(path, key, f"expected an integer ({spec.doc}), got {_describe(value)}")
        _check_number(value, spec, path, key)
    elif kind == "str":
        if not isinstance(value, str):
            raise InputFileError(path, key, f"expected a string ({spec.doc}), got {_describe(value)}")
        if spec.choices is not None and value not in spec.choices:
            options = ", ".join(f'"{c}"' for c in spec.choices)
            raise InputFileError(path, key, f'"{value}" is not one of {options}')
    elif kind == "bool":
        if not isinstance(value, bool):
            raise InputFileError(path, key, f"expected true or false, got {_describe(value)}")
    elif kind == "date":
        if not isinstance(value, (_dt.date, str)):
            raise InputFileError(path, key, f"expected a date like 2026-11-22, got {_describe(value)}")
    elif kind in ("float_list", "range"):
        if not isinstance(value, list):
            raise InputFileError(path, key, f"expected {_TYPE_NAMES[kind]} ({spec.doc}), got {_describe(value)}")
        for index, item in enumerate(value):
            _check_number(item, spec, path, f"{key}[{index}]")
        if kind == "range" and (len(value) != 2 or value[0] > value[1]):
            raise InputFileError(path, key, f"expected [min, max] with min <= max ({spec.doc})")
    elif kind == "float_matrix":
        if not isinstance(value, list) or not all(isinstance(row, list) and len(row) == len(value) for row in value):
            raise InputFileError(path, key, f"expected {_TYPE_NAMES[kind]} ({spec.doc})")
        for i, row in enumerate(value):
            for j, item in enumerate(row):
                _check_number(item, spec, path, f"{key}[{i}][{j}]")
    elif kind == "str_list":
        if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
            raise InputFileError(path, key, f"expected an array of strings ({spec.doc})")
    else:  # pragma: no cover - a spec bug, not a user error
        raise AssertionError(f"unknown field kind {kind}")
