"""The manifest of a results folder that ``sdplan calibrate`` wrote (``manifest.jsonl``).

A header line with the format name, its version and the options of the
measurement, then one line per finished point (:class:`PointRecord`), per
server (its KV cache size) and per invocation (its wall time). The writer is
:class:`sdplan.measure.store.ResultStore`; reading lives here so that a result
reader (:func:`sdplan.runs.read.read_results`) can see which points the sweep
flagged overloaded (:func:`overloaded_files`) without importing the measurement
layer above it.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sdplan.errors import InputFileError

MANIFEST = "manifest.jsonl"
FORMAT = "sdplan-served-measurements"
VERSION = 1


@dataclass(frozen=True, slots=True)
class PointRecord:
    """One finished load point."""

    key: str
    file: str
    configuration: str
    draft_length: int
    label: str
    repeat: int
    foreign_cpu_cores: float | None
    disturbed: bool
    wall_s: float
    #: A Poisson point the server did not keep up with (see :data:`sdplan.runs.screen.MIN_KEPT_UP_FRACTION`).
    overloaded: bool = False


#: The JSON types of a point record's fields (bool is not an int here).
_FIELD_TYPES: dict[str, tuple[type, ...]] = {
    "key": (str,), "file": (str,), "configuration": (str,), "draft_length": (int,), "label": (str,),
    "repeat": (int,), "foreign_cpu_cores": (int, float, type(None)), "disturbed": (bool,), "wall_s": (int, float),
    "overloaded": (bool,),
}


def non_negative_number(value: Any) -> bool:
    """Whether a manifest value is a finite number >= 0 (a JSON true or false is not a number)."""
    return not isinstance(value, bool) and isinstance(value, (int, float)) and 0 <= value < math.inf


def point_record(entry: dict[str, Any]) -> PointRecord:
    """A manifest line as a :class:`PointRecord`; ``ValueError`` naming the field if one has the wrong type."""
    for name, value in entry.items():
        types = _FIELD_TYPES.get(name)
        if types is None:
            raise ValueError(f"unknown field {name!r}")
        numeric = float in types or name in ("draft_length", "repeat")
        wrong = (isinstance(value, bool) and bool not in types) or not isinstance(value, types)
        if wrong or (numeric and value is not None and not non_negative_number(value)):
            raise ValueError(f"{name} = {value!r} is not a {' or '.join(t.__name__ for t in types)}"
                             + (" >= 0" if numeric else ""))
    return PointRecord(**entry)


def read_manifest(path: Path, options: dict[str, Any] | None = None) -> list[PointRecord]:
    """The point records of a manifest, checking its options against ``options`` when given.

    Raises
    ------
    InputFileError
        If the file is not a measurement manifest, or (with ``options``) it was
        measured with other options.
    """
    try:
        lines = [line for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
        header = json.loads(lines[0]) if lines else {}
        well_formed = isinstance(header, dict) and isinstance(header.get("options"), dict)
        if not well_formed or header.get("format") != FORMAT:
            raise ValueError("no header line with its format and options")
        if header.get("version") != VERSION:
            raise ValueError(f"version {header.get('version')!r}, this sdplan reads version {VERSION}")
        if options is not None and header["options"] != options:
            changed = sorted(key for key in set(header["options"]) | set(options)
                             if header["options"].get(key) != options.get(key))
            raise InputFileError(str(path), "options", "was measured with other options ("
                                 + ", ".join(changed[:6]) + "); use the same options with --resume, or another "
                                 "--results-dir")
        records = []
        for line in lines[1:]:
            try:
                entry = json.loads(line)
            except ValueError:
                continue  # a line cut short by a crash: its point is measured again
            if isinstance(entry, dict) and "key" in entry:
                records.append(point_record(entry))
        return records
    except InputFileError:
        raise
    except (ValueError, TypeError, KeyError, IndexError, OSError) as error:
        raise InputFileError(str(path), None, f"not a measurement manifest ({error}); mend or move it, or choose "
                                              "another --results-dir (the result files stay as they are)") from None


def overloaded_files(folder: Path) -> set[str]:
    """Names of the result files in ``folder`` that ``sdplan calibrate`` flagged overloaded (a Poisson point
    the server did not keep up with), from its manifest; empty for any other folder or an unreadable manifest."""
    if not (folder / MANIFEST).is_file():
        return set()
    try:
        records = read_manifest(folder / MANIFEST)
    except InputFileError:
        return set()
    latest = {record.key: record for record in records}  # a point flagged later appears twice
    return {record.file for record in latest.values() if record.overloaded}
