"""Writing files safely: atomic replacement and a minimal TOML serialiser.

Every file sdplan writes goes through :func:`atomic_write_text`: the text is
written to a temporary file in the destination folder, flushed and fsynced,
then renamed over the destination, so a crash or Ctrl-C never leaves a
half-written file and never destroys the previous one.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import tempfile
from pathlib import Path
from typing import Any, Mapping

from sdplan.errors import InputFileError


def atomic_write_text(path: Path, text: str) -> None:
    """Replace ``path`` with UTF-8 ``text`` atomically (see :func:`atomic_write_bytes`)."""
    atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Replace ``path`` with ``data`` atomically (same-folder temp file + rename).

    Raises
    ------
    InputFileError
        If the folder does not exist or is not writable.
    """
    folder = path.resolve().parent
    if not folder.is_dir():
        raise InputFileError(str(path), None, f"folder {folder} does not exist; create it first")
    try:
        handle, temporary = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=folder)
    except OSError as exc:
        raise InputFileError(str(path), None, f"cannot write here ({exc.strerror}); choose a writable path") from None
    try:
        with os.fdopen(handle, "wb") as stream:
            stream.write(data)
            stream.flush()
            os.fsync(stream.fileno())
        if path.exists():
            os.chmod(temporary, path.stat().st_mode & 0o777)
        else:
            umask = os.umask(0)
            os.umask(umask)
            os.chmod(temporary, 0o666 & ~umask)
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


def _scalar(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if value != value or value in (float("inf"), float("-inf")):
            raise ValueError("TOML output must not contain nan or inf")
        text = repr(value)
        return text if any(c in text for c in ".eE") else text + ".0"
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, (_dt.date, _dt.datetime)):
        return value.isoformat()
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_scalar(item) for item in value) + "]"
    raise TypeError(f"cannot write {type(value).__name__} to TOML")


def dumps_toml(document: Mapping[str, Any], header: str = "") -> str:
    """Serialise nested mappings of scalars and scalar arrays to TOML text.

    ``header`` lines are written first as ``#`` comments.
    """
    lines = [f"# {line}".rstrip() for line in header.splitlines()]
    if lines:
        lines.append("")
    _emit(document, [], lines)
    return "\n".join(lines).rstrip("\n") + "\n"


def _emit(table: Mapping[str, Any], path: list[str], lines: list[str]) -> None:
    scalars = {key: value for key, value in table.items() if not isinstance(value, Mapping)}
    tables = {key: value for key, value in table.items() if isinstance(value, Mapping)}
    if path and (scalars or not tables):
        lines.append(f"[{'.'.join(path)}]")
    for key, value in scalars.items():
        text = _scalar(value)
        if isinstance(value, (list, tuple)) and len(key) + len(text) > 96:
            items = "".join(f"    {_scalar(item)},\n" for item in value)
            text = f"[\n{items}]"
        lines.append(f"{key} = {text}")
    if scalars:
        lines.append("")
    for key, value in tables.items():
        _emit(value, [*path, key], lines)
