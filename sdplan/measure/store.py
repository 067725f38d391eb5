"""Where a served calibration keeps what it measured, so nothing is lost and ``--resume`` continues.

A results folder holds the ordinary ``vllm bench serve`` JSON file of every
load point, the server and client logs, and ``manifest.jsonl``: a header with
the options that must not change between resumed invocations, then one line
per finished point (its file, configuration, foreign CPU load, whether it was
disturbed), one line per configuration with the size of its server's KV cache,
and one line per invocation (its wall time). Every line is flushed and fsynced
as it is written.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from dataclasses import asdict
from pathlib import Path
from typing import Any

from sdplan.errors import InputFileError
from sdplan.runs.manifest import FORMAT, MANIFEST, VERSION, PointRecord, non_negative_number, read_manifest


class ResultStore:
    """A results folder with its manifest."""

    def __init__(self, folder: Path, options: dict[str, Any]) -> None:
        self.folder = folder
        self.options = options
        self.path = folder / MANIFEST

    def start(self, resume: bool) -> dict[str, PointRecord]:
        """Open for an invocation; returns the points already measured (on resume).

        Raises
        ------
        InputFileError
            On ``--resume`` with a manifest of other options, or an unreadable one;
            without ``--resume`` when the folder already holds measurements.
        """
        if resume:
            return self.load()
        if self.path.exists() and self.load_records(check=False):
            raise InputFileError(str(self.folder), None, "already holds measurements; continue them with --resume, "
                                                          "or choose another --results-dir")
        self.folder.mkdir(parents=True, exist_ok=True)
        self._write({"format": FORMAT, "version": VERSION, "options": self.options}, mode="w")
        return {}

    def load(self) -> dict[str, PointRecord]:
        if not self.path.exists():
            self.folder.mkdir(parents=True, exist_ok=True)
            self._write({"format": FORMAT, "version": VERSION, "options": self.options}, mode="w")
            return {}
        return {record.key: record for record in self.load_records(check=True)}

    def load_records(self, check: bool) -> list[PointRecord]:
        """The manifest's point records; with ``check``, it must have been measured with these options."""
        return read_manifest(self.path, self.options if check else None)

    def invocation_seconds(self) -> tuple[float, int]:
        """Total wall time of earlier invocations and their count."""
        walls = [self._number(entry, "invocation_wall_s") for entry in self._entries() if "invocation_wall_s" in entry]
        return sum(walls), len(walls)

    def kv_cache_tokens(self) -> dict[str, int]:
        """The KV cache size (tokens) the first server of each configuration reported."""
        sizes: dict[str, int] = {}
        for entry in self._entries():
            if "kv_cache_tokens" in entry:
                sizes.setdefault(str(entry.get("server")), int(self._number(entry, "kv_cache_tokens")))
        return sizes

    def _number(self, entry: dict[str, Any], key: str) -> float:
        """A non-negative number of a manifest line; anything else means the manifest was edited or damaged."""
        value = entry[key]
        if not non_negative_number(value):
            raise InputFileError(str(self.path), key, f"{value!r} is not a non-negative number; mend or move the "
                                                      "manifest, or choose another --results-dir")
        return float(value)

    def record_kv_cache(self, configuration: str, tokens: int) -> None:
        self._write({"server": configuration, "kv_cache_tokens": tokens})

    def _entries(self) -> Iterator[dict[str, Any]]:
        """The manifest's lines after the header that parse (a line cut short by a crash is skipped)."""
        if not self.path.exists():
            return
        for line in self.path.read_text(encoding="utf-8").splitlines()[1:]:
            try:
                entry = json.loads(line)
            except ValueError:
                continue
            if isinstance(entry, dict):
                yield entry

    def append(self, record: PointRecord) -> None:
        self._write(asdict(record))

    def record_invocation(self, wall_s: float) -> None:
        self._write({"invocation_wall_s": round(wall_s, 3)})

    def result_path(self, key: str) -> Path:
        return self.folder / f"{key}.json"

    def set_aside(self, path: Path) -> Path | None:
        """Move a result file no manifest line records out of the way of the point about to be measured into
        it; returns where it went (None: there was none).

        Such a file is a measurement all the same: one that finished as the process was stopped (between the
        file and its line), one whose line a damaged manifest lost, or another run's file in a reused folder.
        Measuring over it would lose it. It is kept as ``NAME.json.unrecorded-N``, which no reader takes for a
        point (:func:`sdplan.runs.sweep_files` reads ``*.json``).
        """
        if not path.exists():
            return None
        number = 1
        while (kept := path.with_name(f"{path.name}.unrecorded-{number}")).exists():
            number += 1
        path.rename(kept)
        return kept

    def _write(self, entry: dict[str, Any], mode: str = "a") -> None:
        # a line cut short by a crash (or an edit) has no newline: the next line must not be glued onto it,
        # which would make both unreadable
        cut = mode == "a" and self.path.exists() and not _ends_with_newline(self.path)
        with self.path.open(mode, encoding="utf-8") as stream:
            stream.write(("\n" if cut else "") + json.dumps(entry) + "\n")
            stream.flush()
            os.fsync(stream.fileno())


def _ends_with_newline(path: Path) -> bool:
    """Whether ``path`` is empty or its last byte is a newline."""
    with path.open("rb") as stream:
        if stream.seek(0, os.SEEK_END) == 0:
            return True
        stream.seek(-1, os.SEEK_END)
        return stream.read(1) == b"\n"
