"""Finding the runs in files and folders: format registry, detection and dispatch.

Each input format is one module of :mod:`sdplan.runs` with a ``NAME`` (its
``--input-format`` value), a ``DESCRIPTION`` (for the error on an unknown
file), ``detects(path, content) -> bool`` and ``read(where, content) ->
(runs, warnings)``, and one :class:`Reader` entry in :data:`READERS`. A
``"text"`` reader gets a file's whole text (CSV); a ``"json"`` reader gets
each decoded JSON object (a file of JSON Lines is one object per line). In
``auto`` mode the text readers are asked first, by name and text, then each
JSON object goes to the first JSON reader that claims it, in registry order.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from sdplan.errors import InputFileError, InvalidValueError
from sdplan.runs import csv, guidellm, inferencex, prometheus_api, prometheus_text, silicon, vllm_bench
from sdplan.runs.facts import RunFacts, split_file_facts
from sdplan.runs.manifest import overloaded_files
from sdplan.runs.record import BenchmarkRun, check_domain, read_text, sweep_files
from sdplan.runs.screen import stalled_note


@dataclass(frozen=True, slots=True)
class Reader:
    """One input format: how to recognise it and how to read it (see the module notes)."""

    name: str
    description: str
    #: ``"text"``: ``read`` gets the file's text; ``"json"``: each decoded JSON object; ``"stream"``: the path, to
    #: read in bounded memory (``detects`` gets the head of the file's text, ``read`` the server labels of
    #: ``--select`` and the window length of ``--window``).
    content: str
    detects: Callable[[Path, Any], bool]
    read: Callable[..., tuple[list[BenchmarkRun], list[str]]]
    #: Whether ``read`` takes a :class:`~sdplan.runs.silicon.Selection` (``--select``) as a third argument.
    selects: bool = False


def _reader(module: Any, content: str) -> Reader:
    return Reader(module.NAME, module.DESCRIPTION, content, module.detects, module.read,
                  getattr(module, "SELECTS", False))


#: Every input format, in the order ``auto`` tries them (silicon before csv, which claims every ``.csv``; the
#: metrics readers first, by the head of a file, since their files may be too large to read whole).
READERS = (
    _reader(prometheus_text, "stream"),
    _reader(prometheus_api, "stream"),
    _reader(vllm_bench, "json"),
    _reader(guidellm, "json"),
    _reader(silicon, "text"),
    _reader(inferencex, "json"),
    _reader(csv, "text"),
)
#: ``--input-format`` values.
FORMATS = ("auto",) + tuple(reader.name for reader in READERS)
_BY_NAME = {reader.name: reader for reader in READERS}


def detect_format(path: Path, document: Any) -> str:
    """The format of a decoded JSON object of ``path`` (the first JSON reader that claims it).

    Raises
    ------
    InputFileError
        If no reader recognises it.
    """
    for reader in READERS:
        if reader.content == "json" and reader.detects(path, document):
            return reader.name
    names = [reader.description for reader in READERS]
    listed = ", ".join(names[:-1]) + " or " + names[-1] if len(names) > 1 else names[0]
    raise InputFileError(str(path), None, f"unrecognised result format (not {listed}); force one with "
                                          "--input-format")


def _json_documents(text: str, name: str, forced: bool) -> list[tuple[str, Any]]:
    """One JSON document, JSON Lines (``--append-result``) or a JSON array of rows: ``[(suffix, document)]``."""
    try:
        document = json.loads(text)
    except json.JSONDecodeError as whole:
        lines = [line for line in text.splitlines() if line.strip()]
        if len(lines) > 1:
            documents = []
            for number, line in enumerate(lines, start=1):
                try:
                    documents.append((f"#{number}", json.loads(line)))
                except json.JSONDecodeError as error:
                    raise InputFileError(name, f"line {number}", f"invalid JSON ({error.msg}); fix or remove the "
                                                                 "line") from None
            return documents
        hint = "fix the file" if forced else "for CSV use a .csv name or --input-format csv"
        raise InputFileError(name, None, f"invalid JSON ({whole.msg} at line {whole.lineno}); {hint}") from None
    if isinstance(document, list):  # an array of rows (InferenceX): each element is one document
        if not document:
            raise InputFileError(name, None, "an empty JSON array: no runs in it")
        return [(f"#[{index}]", item) for index, item in enumerate(document)]
    return [("", document)]


def read_results(path: Path, input_format: str = "auto", selection: silicon.Selection | None = None,
                 window_s: float | None = None) -> tuple[list[BenchmarkRun], list[str]]:
    """Runs of one file or sweep folder, and warnings about it.

    ``selection`` (``--select``) is for readers that take one (a silicon
    sample holds many configurations); any other format refuses it.

    Raises
    ------
    InputFileError
        If the file cannot be read, has an unknown format, or a required field
        is missing or malformed (the message names the file and the field).
    """
    name = str(path)
    if input_format != "auto" and input_format not in _BY_NAME:
        raise InvalidValueError(f"unknown input format {input_format}; one of {', '.join(FORMATS)}")
    if path.is_dir():
        if selection:
            raise InvalidValueError(f"--select {selection.describe()}: picks rows of AIConfigurator silicon files; "
                                    f"{name} is a folder")
        members = sweep_files(path)
        if not members:
            raise InputFileError(name, None, "folder holds no result files (*.json); give files or a vllm bench "
                                             "sweep output folder")
        flagged = overloaded_files(path)  # a folder sdplan calibrate wrote
        runs, warnings = [], []
        for member in members:
            found, notes = read_results(member, input_format)
            runs += [replace(run, source=f"{path.name}/{member.relative_to(path).as_posix()}"
                                         + (run.source[run.source.index("#"):] if "#" in run.source else ""),
                             overloaded=member.parent == path and member.name in flagged) for run in found]
            warnings += notes
        return runs, warnings
    forced = _BY_NAME.get(input_format)
    streamed = _stream_reader(path, forced)
    if streamed is not None:
        return _read_stream(streamed, path, selection, window_s)
    text = read_text(path)
    text_reader = forced if forced is not None and forced.content == "text" else next(
        (reader for reader in READERS if forced is None and reader.content == "text" and reader.detects(path, text)),
        None)
    if selection and selection.labels and text_reader is not None:
        raise InvalidValueError(f"--select {selection.describe()}: server labels pick a server of a Prometheus "
                                f"metrics file; {name} is not one (rows of a silicon file are picked by "
                                f"{', '.join(silicon.KEYS)})")
    if selection and (text_reader is None or not text_reader.selects):
        raise InvalidValueError(f"--select {selection.describe()}: picks rows of AIConfigurator silicon files "
                                f"(--input-format {silicon.NAME}); {name} is not one")
    if text_reader is not None:
        found, warnings = (text_reader.read(name, text, selection) if text_reader.selects
                           else text_reader.read(name, text))
        own = path.name  # rows are named file:line; the error names the path given
        return [check_domain(run, name + run.source[len(own):] if run.source.startswith(own) else name)
                for run in found], warnings
    runs, warnings = [], []
    for suffix, document in _json_documents(text, name, forced=forced is not None):
        where = name + suffix
        reader = forced if forced is not None else _BY_NAME[detect_format(path, document)]
        if not isinstance(document, dict):
            raise InputFileError(where, None, f"expected a JSON object for a {reader.name} result, got "
                                              f"{type(document).__name__}")
        found, notes = reader.read(where, document)
        runs += [check_domain(run, where) for run in found]
        warnings += notes
    return runs, warnings


def load_runs(paths: list[str], input_format: str, draft_length: int | None, alpha: float | None,
              selection: silicon.Selection | None = None,
              window_s: float | None = None) -> tuple[list[BenchmarkRun], list[str]]:
    """Read every file or folder; flags and per-file facts fill in only what files do not record.

    Each argument may carry per-file facts, ``FILE:k=4,len=2.8`` (see
    :func:`split_file_facts`); they win over the flags for that file.
    ``aic:silicon_sample`` names the installed AIConfigurator's measured rows
    (:func:`sdplan.runs.silicon.resolve_path`); ``selection`` picks a
    configuration of a silicon file.

    Runs are named by their path relative to the folder all arguments share
    (:func:`_relative_names`), so that runs of equally named files in
    different folders (``pass1/k2.json``, ``pass2/k2.json``) stay apart.
    """
    if input_format not in FORMATS:
        raise InvalidValueError(f"unknown input format {input_format}; one of {', '.join(FORMATS)}")
    flags = RunFacts(draft_length=draft_length, alpha=alpha)
    runs, warnings = [], []
    arguments = [(silicon.resolve_path(name), facts) for name, facts in map(split_file_facts, paths)]
    prefixes = _relative_names([str(path) for path, _ in arguments])
    seen: dict[str, int] = {}
    for (path, facts), prefix in zip(arguments, prefixes):
        found, notes = read_results(path, input_format, selection, window_s)
        for run in found:
            if facts is not None:
                run = facts.force(run)
            run = flags.fill(run)
            own = path.name
            source = prefix + run.source[len(own):] if run.source.startswith(own) else run.source
            seen[source] = seen.get(source, 0) + 1
            if seen[source] > 1:  # the same file given twice
                source += f" ({seen[source]})"
            runs.append(replace(run, source=source))
        warnings.extend(notes)
    stalled = stalled_note(runs)
    return runs, warnings + ([stalled] if stalled else [])


def _stream_reader(path: Path, forced: Reader | None) -> Reader | None:
    """The ``"stream"`` reader of a file: the forced one, or the first whose ``detects`` claims its head."""
    if forced is not None:
        return forced if forced.content == "stream" else None
    streams = [reader for reader in READERS if reader.content == "stream"]
    if not streams or not path.is_file():
        return None
    from sdplan.metrics.textfile import head_text

    head = head_text(path)
    return next((reader for reader in streams if head and reader.detects(path, head)), None)


def _read_stream(reader: Reader, path: Path, selection: silicon.Selection | None,
                 window_s: float | None) -> tuple[list[BenchmarkRun], list[str]]:
    """The runs of a metrics file (one per window); ``--select`` picks a server by its labels."""
    name = str(path)
    if selection and selection.filters:
        raise InvalidValueError(f"--select {selection.describe()}: picks rows of AIConfigurator silicon files; "
                                f"pick a server of {name} by its labels, e.g. model_name=NAME or instance=HOST:PORT")
    if not path.is_file():
        raise InputFileError(name, None, "no such file; check the path")
    found, warnings = reader.read(name, path, selection.labels if selection else (), window_s)
    own = path.name
    return [check_domain(run, name + run.source[len(own):] if run.source.startswith(own) else name)
            for run in found], warnings


def _relative_names(paths: list[str]) -> list[str]:
    """Each path relative to the folder that holds all of them (``/`` separated; the name alone for one folder)."""
    absolute = [os.path.abspath(path) for path in paths]
    try:
        base = os.path.commonpath([os.path.dirname(path) for path in absolute]) if absolute else ""
    except ValueError:  # paths on different drives
        return [Path(path).name for path in paths]
    return [Path(os.path.relpath(path, base)).as_posix() if base else Path(path).name for path in absolute]
