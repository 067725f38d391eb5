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
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from sdplan.errors import InputFileError


def atomic_write_text(path: Path, text: str) -> None:
    """Replace ``path`` with UTF-8 ``text`` atomically (see :func:`atomic_write_bytes`)."""
    atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Replace ``path`` with ``data`` atomically (same-folder temp file + rename).

    A path that already exists and is not a regular file or a folder (a
    character device such as ``/dev/null`` or ``/dev/stdout``, a FIFO) is a
    stream: it is written in place, never replaced.

    Raises
    ------
    InputFileError
        If the path names a folder, the folder does not exist or is not
        writable, or the write fails (disk full, quota, I/O error); nothing
        is left behind and an existing file is kept intact.
    """
    text = str(path)
    if text in ("", ".", "..") or text.endswith(("/", "/.", "/..")):
        raise InputFileError(text or "''", None, "is a folder, not a file name; give a file name, e.g. out.json")
    try:
        target = path.resolve() if path.is_symlink() else path
        if target.is_dir():
            raise InputFileError(text, None, "is a folder; give a file name inside it, e.g. "
                                 f"{(path / 'out.json')}")
        if target.exists() and not target.is_file():
            _write_stream(target, data, text)
            return
        folder = target.absolute().parent
        if not folder.is_dir():
            raise InputFileError(text, None, f"folder {folder} does not exist; create it first")
    except OSError as exc:
        raise InputFileError(text, None, f"cannot write here ({exc.strerror}); choose another path") from None
    try:
        # the name is cut so that the temporary file's name stays within the file system's limit
        handle, temporary = tempfile.mkstemp(prefix=f".{target.name[:64]}.", suffix=".tmp", dir=folder)
    except OSError as exc:
        raise InputFileError(text, None, f"cannot write here ({exc.strerror}); choose a writable path") from None
    try:
        with os.fdopen(handle, "wb") as stream:
            stream.write(data)
            stream.flush()
            os.fsync(stream.fileno())
        if target.exists():
            os.chmod(temporary, target.stat().st_mode & 0o777)
        else:
            umask = os.umask(0)
            os.umask(umask)
            os.chmod(temporary, 0o666 & ~umask)
        os.replace(temporary, target)
    except OSError as exc:
        Path(temporary).unlink(missing_ok=True)
        raise InputFileError(text, None, f"cannot write ({exc.strerror}); nothing was written, "
                             "the previous file (if any) is intact; free space or choose another path") from None
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


def _write_stream(target: Path, data: bytes, text: str) -> None:
    """Write to a device or FIFO in place (``/dev/null``, ``/dev/stdout``): it cannot be replaced."""
    try:
        with target.open("wb") as stream:
            stream.write(data)
            stream.flush()
    except OSError as exc:
        raise InputFileError(text, None, f"cannot write ({exc.strerror}); choose another path") from None


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
