"""Reading benchmark results: vLLM ``bench serve`` JSON, GuideLLM reports, plain CSV.

Every format is normalised into :class:`BenchmarkRun` records in SI units
(seconds, requests per second) with the per-token acceptance, so that fits
and validations never see a unit or a field name of the source. Field lists
follow ``anchors.md`` §3:

* vLLM: ``request_rate`` (a number or the string ``"inf"``),
  ``request_throughput``, ``completed``, ``failed``, ``total_input_tokens``,
  ``total_output_tokens``, ``mean_e2el_ms`` (only when ``e2el`` was among the
  percentile metrics), ``mean_ttft_ms``, ``mean_tpot_ms``, and the
  ``spec_decode_*`` fields (acceptance rate in **percent**). Older versions
  wrote ``"request_goodput:"`` with a colon; it is accepted and ignored.
* GuideLLM v2 (``metadata.version == 2``): ``benchmarks[]`` with
  ``metrics.<name>.successful.mean``; ``request_latency`` in **seconds**,
  ``time_to_first_token_ms`` in ms, ``inter_token_latency_ms`` (excludes the
  first token, the match for vLLM's TPOT; ``time_per_output_token_ms``
  includes it and is not used), ``request_concurrency`` (mean in-flight
  requests: allows a Little's-law check).
* CSV: ``request_rate_rps, draft_length, acceptance, prompt_tokens,
  output_tokens, mean_e2e_latency_s[, mean_concurrency]``; ``acceptance`` is
  the per-token alpha.
"""

from __future__ import annotations

import csv
import hashlib
import json
import math
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from sdplan.errors import InputFileError, InvalidValueError

FORMATS = ("auto", "vllm", "guidellm", "csv")
CSV_REQUIRED = ("request_rate_rps", "draft_length", "acceptance", "prompt_tokens", "output_tokens",
                "mean_e2e_latency_s")


@dataclass(frozen=True, slots=True, kw_only=True)
class BenchmarkRun:
    """One load level of one configuration, in SI units.

    Attributes
    ----------
    source : str
        File and position, e.g. ``run.json`` or ``report.json#benchmarks[2]``.
    requested_rate_rps : float or None
        Offered load; None for unbounded (``inf``/throughput) or closed-loop runs.
    achieved_rate_rps : float
        Completed requests per second: the lambda of the model.
    draft_length : int
        0 for no SD.
    alpha : float or None
        Per-token acceptance (converted from what the file gives); None if unknown.
    open_loop_unbounded : bool
        True for a max-load run (vLLM ``request_rate = inf``, GuideLLM ``throughput``).
    """

    source: str
    requested_rate_rps: float | None
    achieved_rate_rps: float
    draft_length: int
    alpha: float | None
    prompt_tokens: float
    output_tokens: float
    mean_e2e_latency_s: float
    mean_ttft_s: float | None = None
    mean_tpot_s: float | None = None
    mean_concurrency: float | None = None
    completed: int | None = None
    failed: int | None = None
    open_loop_unbounded: bool = False
    notes: tuple[str, ...] = ()


def file_digest(path: Path) -> str:
    """``sha256:<hex>`` of a file, recorded as a fit's provenance."""
    return "sha256:" + hashlib.sha256(path.read_bytes()).hexdigest()


def _number(value: Any, path: str, key: str, *, allow_none: bool = False) -> float | None:
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        if isinstance(value, str):
            try:
                value = float(value)
            except ValueError:
                raise InputFileError(path, key, f"expected a number, got \"{value}\"") from None
        else:
            raise InputFileError(path, key, f"expected a number, got {type(value).__name__}")
    if not math.isfinite(value) and not (allow_none and math.isinf(value)):
        raise InputFileError(path, key, f"must be finite, got {value}")
    return float(value)


def detect_format(path: Path, document: Any | None) -> str:
    if path.suffix.lower() == ".csv":
        return "csv"
    if isinstance(document, dict) and isinstance(document.get("benchmarks"), list):
        return "guidellm"
    if isinstance(document, dict) and ("request_throughput" in document or "completed" in document):
        return "vllm"
    raise InputFileError(str(path), None, "unrecognised result format (not vLLM bench serve JSON, a GuideLLM "
                                          "report or CSV); force one with --input-format")


def read_results(path: Path, input_format: str = "auto") -> tuple[list[BenchmarkRun], list[str]]:
    """Runs of one file, and warnings about it.

    Raises
    ------
    InputFileError
        If the file cannot be read, has an unknown format, or a required field
        is missing or malformed (the message names the file and the field).
    """
    name = str(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise InputFileError(name, None, "no such file; check the path") from None
    except (OSError, UnicodeDecodeError) as error:
        raise InputFileError(name, None, f"cannot read ({error}); pass a UTF-8 result file") from None
    document = None
    if input_format in ("auto", "vllm", "guidellm") and path.suffix.lower() != ".csv":
        try:
            document = json.loads(text)
        except json.JSONDecodeError as error:
            if input_format != "auto":
                raise InputFileError(name, None, f"invalid JSON ({error}); fix the file") from None
            raise InputFileError(name, None, f"invalid JSON ({error}); for CSV use a .csv name or --input-format csv") from None
    kind = detect_format(path, document) if input_format == "auto" else input_format
    if kind == "csv":
        return _read_csv(name, text), []
    if not isinstance(document, dict):
        raise InputFileError(name, None, f"expected a JSON object for a {kind} result")
    if kind == "vllm":
        return [_read_vllm(name, document)], []
    return _read_guidellm(name, document)


def _acceptance_from_vllm(document: dict[str, Any], path: str) -> tuple[int, float | None, list[str]]:
    """(draft length, per-token alpha, notes) from vLLM's spec_decode fields."""
    from sdplan.acceptance import alpha_from_mean_length

    notes = []
    per_position = document.get("spec_decode_per_position_acceptance_rates")
    drafts = document.get("spec_decode_num_drafts")
    draft_tokens = document.get("spec_decode_draft_tokens")
    k = None
    if isinstance(per_position, list) and per_position:
        k = len(per_position)
    elif drafts and draft_tokens:
        k = round(_number(draft_tokens, path, "spec_decode_draft_tokens") / _number(drafts, path, "spec_decode_num_drafts"))
    for key in ("num_speculative_tokens", "draft_length"):
        if k is None and key in document:
            k = int(_number(document[key], path, key) or 0)
    if not k:
        return 0, None, notes
    length = document.get("spec_decode_acceptance_length")
    rate = document.get("spec_decode_acceptance_rate")
    if length is not None:
        tau = _number(length, path, "spec_decode_acceptance_length")
    elif rate is not None:
        tau = 1.0 + k * _number(rate, path, "spec_decode_acceptance_rate") / 100.0  # percent
    else:
        return k, None, ["SD run without acceptance fields"]
    tau = min(max(tau, 1.0), k + 1.0)
    return k, float(alpha_from_mean_length(tau, k)), notes


def _read_vllm(path: str, document: dict[str, Any]) -> BenchmarkRun:
    completed = document.get("completed")
    if completed is None:
        raise InputFileError(path, "completed", "missing; not a vLLM bench serve result?")
    completed_n = int(_number(completed, path, "completed"))
    if completed_n <= 0:
        raise InputFileError(path, "completed", "no completed requests; nothing to fit")
    failed = int(_number(document.get("failed", 0), path, "failed") or 0)
    if "request_throughput" in document:
        achieved = _number(document["request_throughput"], path, "request_throughput")
    elif "duration" in document:
        achieved = completed_n / _number(document["duration"], path, "duration")
    else:
        raise InputFileError(path, "request_throughput", "missing (and no duration to derive it)")
    requested_raw = document.get("request_rate")
    unbounded = isinstance(requested_raw, str) and requested_raw.strip().lower() == "inf"
    requested = None if unbounded or requested_raw is None else _number(requested_raw, path, "request_rate",
                                                                        allow_none=True)
    if requested is not None and math.isinf(requested):
        requested, unbounded = None, True
    for key in ("total_input_tokens", "total_output_tokens"):
        if key not in document:
            raise InputFileError(path, key, "missing; needed for the prompt/output lengths")
    prompt = _number(document["total_input_tokens"], path, "total_input_tokens") / completed_n
    output = _number(document["total_output_tokens"], path, "total_output_tokens") / completed_n
    ttft = document.get("mean_ttft_ms")
    tpot = document.get("mean_tpot_ms")
    ttft_s = _number(ttft, path, "mean_ttft_ms") / 1e3 if ttft is not None else None
    tpot_s = _number(tpot, path, "mean_tpot_ms") / 1e3 if tpot is not None else None
    notes: list[str] = []
    if document.get("mean_e2el_ms") is not None:
        latency = _number(document["mean_e2el_ms"], path, "mean_e2el_ms") / 1e3
    elif ttft_s is not None and tpot_s is not None:
        latency = ttft_s + tpot_s * max(output - 1.0, 0.0)
        notes.append("mean E2E latency derived as TTFT + TPOT x (output - 1): e2el was not among --percentile-metrics")
    else:
        raise InputFileError(path, "mean_e2el_ms", "missing, and no mean_ttft_ms/mean_tpot_ms to derive it; "
                                                   "rerun vllm bench serve with --percentile-metrics ttft,tpot,itl,e2el")
    k, alpha, more = _acceptance_from_vllm(document, path)
    return BenchmarkRun(
        source=Path(path).name, requested_rate_rps=requested, achieved_rate_rps=float(achieved),
        draft_length=k, alpha=alpha, prompt_tokens=prompt, output_tokens=output, mean_e2e_latency_s=latency,
        mean_ttft_s=ttft_s, mean_tpot_s=tpot_s, mean_concurrency=None, completed=completed_n, failed=failed,
        open_loop_unbounded=unbounded, notes=tuple(notes + more),
    )


def _mean(metrics: dict[str, Any], name: str, path: str, where: str, required: bool = True) -> float | None:
    entry = metrics.get(name)
    try:
        value = entry["successful"]["mean"]  # type: ignore[index]
    except (KeyError, TypeError):
        if required:
            raise InputFileError(path, f"{where}.metrics.{name}.successful.mean", "missing") from None
        return None
    return _number(value, path, f"{where}.metrics.{name}.successful.mean")


def _read_guidellm(path: str, document: dict[str, Any]) -> tuple[list[BenchmarkRun], list[str]]:
    warnings = []
    version = (document.get("metadata") or {}).get("version")
    if version != 2:
        warnings.append(f"{path}: GuideLLM report without metadata.version 2 (older than v0.7?): schema unverified")
    runs = []
    for index, bench in enumerate(document["benchmarks"]):
        where = f"benchmarks[{index}]"
        if not isinstance(bench, dict) or not isinstance(bench.get("metrics"), dict):
            raise InputFileError(path, f"{where}.metrics", "missing or not an object")
        metrics = bench["metrics"]
        strategy = ((bench.get("config") or {}).get("strategy") or {})
        kind = strategy.get("type_", "unknown")
        requested = None
        if kind in ("constant", "poisson") and strategy.get("rate") is not None:
            requested = _number(strategy["rate"], path, f"{where}.config.strategy.rate")
        totals = metrics.get("request_totals") or {}
        successful = int(totals.get("successful", 0) or 0)
        failed = int((totals.get("errored", 0) or 0) + (totals.get("incomplete", 0) or 0))
        ttft = _mean(metrics, "time_to_first_token_ms", path, where, required=False)
        itl = _mean(metrics, "inter_token_latency_ms", path, where, required=False)
        runs.append(BenchmarkRun(
            source=f"{Path(path).name}#{where}",
            requested_rate_rps=requested,
            achieved_rate_rps=_mean(metrics, "requests_per_second", path, where),  # type: ignore[arg-type]
            draft_length=0,
            alpha=None,
            prompt_tokens=_mean(metrics, "prompt_token_count", path, where),  # type: ignore[arg-type]
            output_tokens=_mean(metrics, "output_token_count", path, where),  # type: ignore[arg-type]
            mean_e2e_latency_s=_mean(metrics, "request_latency", path, where),  # type: ignore[arg-type]
            mean_ttft_s=ttft / 1e3 if ttft is not None else None,
            mean_tpot_s=itl / 1e3 if itl is not None else None,
            mean_concurrency=_mean(metrics, "request_concurrency", path, where, required=False),
            completed=successful or None,
            failed=failed,
            open_loop_unbounded=kind == "throughput",
        ))
    if not runs:
        raise InputFileError(path, "benchmarks", "empty; nothing to fit")
    return runs, warnings


def _read_csv(path: str, text: str) -> list[BenchmarkRun]:
    reader = csv.DictReader(text.splitlines())
    columns = reader.fieldnames or []
    missing = [name for name in CSV_REQUIRED if name not in columns]
    if missing:
        raise InputFileError(path, missing[0], f"missing column; the header must include {', '.join(CSV_REQUIRED)}")
    runs = []
    for line, row in enumerate(reader, start=2):
        where = f"line {line}"

        def field(name: str) -> float:
            value = _number(row[name], path, f"{where}: {name}")
            assert value is not None
            return value

        k = field("draft_length")
        alpha = field("acceptance")
        if k < 0 or k != int(k):
            raise InputFileError(path, f"{where}: draft_length", "must be an integer >= 0")
        if not 0.0 <= alpha <= 1.0:
            raise InputFileError(path, f"{where}: acceptance", "per-token acceptance must lie in [0, 1]")
        for name in ("request_rate_rps", "prompt_tokens", "output_tokens", "mean_e2e_latency_s"):
            if field(name) <= 0:
                raise InputFileError(path, f"{where}: {name}", "must be > 0")
        concurrency = row.get("mean_concurrency")
        runs.append(BenchmarkRun(
            source=f"{Path(path).name}:{line}", requested_rate_rps=field("request_rate_rps"),
            achieved_rate_rps=field("request_rate_rps"), draft_length=int(k), alpha=alpha if k > 0 else None,
            prompt_tokens=field("prompt_tokens"), output_tokens=field("output_tokens"),
            mean_e2e_latency_s=field("mean_e2e_latency_s"),
            mean_concurrency=_number(concurrency, path, f"{where}: mean_concurrency") if concurrency else None,
        ))
    if not runs:
        raise InputFileError(path, None, "no data rows")
    return runs


def with_overrides(run: BenchmarkRun, draft_length: int | None, alpha: float | None) -> BenchmarkRun:
    """Apply ``--draft-length``/acceptance flags to runs whose file does not say (flags win)."""
    if draft_length is not None:
        run = replace(run, draft_length=draft_length)
    if alpha is not None:
        run = replace(run, alpha=alpha)
    if run.draft_length == 0:
        run = replace(run, alpha=None)
    return run


#: Steady-state screening thresholds.
MAX_FAILED_FRACTION = 0.01
MIN_ACHIEVED_FRACTION = 0.9
MAX_LITTLE_DEVIATION = 0.15


def screen(run: BenchmarkRun) -> list[str]:
    """Reasons to leave a run out of a fit (empty: keep it).

    Checks: failed requests (> 1%), a max-load run (not at steady state),
    achieved rate below 90% of the requested one (saturated), Little's law
    (mean concurrency vs lambda*L, > 15% apart) where concurrency is
    reported, and SD runs with no acceptance.
    """
    reasons = []
    total = (run.completed or 0) + (run.failed or 0)
    if run.failed and total and run.failed / total > MAX_FAILED_FRACTION:
        reasons.append(f"{run.failed} of {total} requests failed")
    if run.open_loop_unbounded:
        reasons.append("max-load run (request rate inf / throughput): not at steady state")
    if run.requested_rate_rps and run.achieved_rate_rps < MIN_ACHIEVED_FRACTION * run.requested_rate_rps:
        reasons.append(f"achieved {run.achieved_rate_rps:.3g} of {run.requested_rate_rps:.3g} req/s requested: saturated")
    if run.mean_concurrency is not None:
        little = run.achieved_rate_rps * run.mean_e2e_latency_s
        if abs(little - run.mean_concurrency) > MAX_LITTLE_DEVIATION * max(run.mean_concurrency, 1e-9):
            reasons.append(f"Little's law off: mean concurrency {run.mean_concurrency:.3g} vs lambda*L {little:.3g}")
    if run.draft_length > 0 and run.alpha is None:
        reasons.append("SD run without acceptance: give --acceptance (or include spec_decode fields)")
    return reasons


def load_runs(paths: list[str], input_format: str, draft_length: int | None,
              alpha: float | None) -> tuple[list[BenchmarkRun], list[str]]:
    """Read every file, apply overrides; returns runs and warnings."""
    if input_format not in FORMATS:
        raise InvalidValueError(f"unknown input format {input_format}; one of {', '.join(FORMATS)}")
    runs, warnings = [], []
    for name in paths:
        found, notes = read_results(Path(name), input_format)
        runs.extend(with_overrides(run, draft_length, alpha) for run in found)
        warnings.extend(notes)
    return runs, warnings
