"""Plain CSV results, one run per row, as :class:`~sdplan.runs.record.BenchmarkRun` records.

Columns: ``request_rate_rps, draft_length, acceptance, prompt_tokens,
output_tokens, mean_e2e_latency_s[, mean_concurrency, mean_ttft_s,
max_concurrency]``; ``acceptance`` is the per-token alpha. A row with
``max_concurrency`` is a closed loop of that many clients.
"""

from __future__ import annotations

import csv
from pathlib import Path

from sdplan.errors import InputFileError
from sdplan.runs.record import BenchmarkRun, number

#: How :mod:`sdplan.runs.read` names this format (``--input-format csv``) and describes it in errors.
NAME = "csv"
DESCRIPTION = "CSV"
#: Columns every CSV file must have.
REQUIRED = ("request_rate_rps", "draft_length", "acceptance", "prompt_tokens", "output_tokens",
            "mean_e2e_latency_s")


def detects(path: Path, text: str) -> bool:
    """Whether a file is CSV results: by its name (``.csv``), as before any content is parsed."""
    return path.suffix.lower() == ".csv"


def read(path: str, text: str) -> tuple[list[BenchmarkRun], list[str]]:
    """The runs of a CSV file's text, and no warnings."""
    return read_rows(path, text), []


def read_rows(path: str, text: str) -> list[BenchmarkRun]:
    """One run per data row of a CSV file with the :data:`REQUIRED` columns."""
    try:
        return _rows(path, text)
    except csv.Error as error:  # e.g. a field over the csv module's 128 KiB limit
        raise InputFileError(path, None, f"not valid CSV ({str(error)[:120]}); write one run per line with the "
                             f"columns {', '.join(REQUIRED)}") from None


def _rows(path: str, text: str) -> list[BenchmarkRun]:
    reader = csv.DictReader(text.splitlines())
    columns = reader.fieldnames or []
    missing = [name for name in REQUIRED if name not in columns]
    if missing:
        raise InputFileError(path, missing[0], f"missing column; the header must include {', '.join(REQUIRED)}")
    runs = []
    for line, row in enumerate(reader, start=2):
        where = f"line {line}"

        def field(name: str, optional: bool = False, row: dict[str, str] = row, where: str = where) -> float | None:
            raw = row.get(name)
            if raw is None or (optional and not str(raw).strip()):
                if optional:
                    return None
                raise InputFileError(path, f"{where}: {name}", "missing value")
            return number(raw, path, f"{where}: {name}")

        k = field("draft_length")
        alpha = field("acceptance")
        assert k is not None and alpha is not None
        if k < 0 or k != int(k) or k > 1024:
            raise InputFileError(path, f"{where}: draft_length", "must be a whole number in [0, 1024]")
        if not 0.0 <= alpha <= 1.0:
            raise InputFileError(path, f"{where}: acceptance", "per-token acceptance must lie in [0, 1]")
        for name in ("request_rate_rps", "prompt_tokens", "output_tokens", "mean_e2e_latency_s"):
            if field(name) <= 0:  # type: ignore[operator]
                raise InputFileError(path, f"{where}: {name}", "must be > 0")
        max_concurrency = field("max_concurrency", optional=True)
        rate = field("request_rate_rps")
        runs.append(BenchmarkRun(
            source=f"{Path(path).name}:{line}", requested_rate_rps=None if max_concurrency else rate,
            achieved_rate_rps=rate, draft_length=int(k), alpha=alpha if k > 0 else None,  # type: ignore[arg-type]
            prompt_tokens=field("prompt_tokens"), output_tokens=field("output_tokens"),  # type: ignore[arg-type]
            mean_e2e_latency_s=field("mean_e2e_latency_s"),  # type: ignore[arg-type]
            mean_ttft_s=field("mean_ttft_s", optional=True),
            concurrency=int(max_concurrency) if max_concurrency else None,
            mean_concurrency=field("mean_concurrency", optional=True),
            records_draft_length=True, records_acceptance=True,
        ))
    if not runs:
        raise InputFileError(path, None, "no data rows")
    return runs
