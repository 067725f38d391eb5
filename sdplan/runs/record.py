"""The record of one measured run, and the statistics every reader shares.

Every format is normalised into :class:`BenchmarkRun` records in SI units
(seconds, requests per second), so fits and validations never see a unit or
a field name of the source. The number helpers here (:func:`number`,
:func:`optional_number`, :func:`count`) turn a file's fields into numbers or
raise an :class:`~sdplan.errors.InputFileError` naming the file and field.

The load a request sees
-----------------------
The model's ``B`` is the mean number of *other* requests in flight during a
request (``L = C1 + B C2``, ``docs/model.md#open-and-closed-loops``). With per-request start times and
latencies it is measured exactly: the integral of the number in flight over
each request's sojourn, divided by its length, minus itself
(:func:`others_in_flight`). It needs no Little's law and no arrival rate, holds
for open and closed loops alike, and includes warm-up and drain as they
happened. Without the lists, ``B = lambda L`` with the *arrival* rate for open
loops (throughput includes the drain and reads 2-8% low) and ``N - 1`` for a
closed loop of ``N`` clients.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from sdplan.errors import InputFileError
from sdplan.latency.model import closed_loop_others
from sdplan.limits import MAX_LATENCY_S, MAX_RATE_RPS, MAX_TOKENS

#: Largest result file read (bytes); a larger one is refused rather than loaded.
MAX_RESULT_BYTES = 512 * 1024 * 1024

#: Files of a ``vllm bench sweep`` folder that are not runs.
SWEEP_SKIP = ("summary.json", "warmup.json")


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
        Fraction of decode steps that carried a draft (:func:`sdplan.runs.vllm_bench.draft_coverage`), if recorded.
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
    #: An open-loop run's :func:`sdplan.runs.screen.kept_up_fraction` (None: a closed loop, or no per-request times).
    kept_up: float | None = None
    #: A closed loop's :func:`full_load_share`: the share of its duration with all its clients' requests in flight
    #: (None: an open loop, or no per-request times).
    full_load_share: float | None = None
    #: ``vllm bench serve --ramp-up-strategy``: how the arrival rate rose during the run (None: it did not).
    ramp_up: str | None = None
    #: An open loop's arrival process as vLLM's ``--burstiness``, the shape of its gamma-distributed gaps
    #: (1: Poisson; below 1 burstier; ``inf``: a constant rate, also GuideLLM ``constant``); None: unknown.
    burstiness: float | None = None
    #: An open loop's client-side cap on requests in flight (``--max-concurrency`` with a finite rate).
    client_cap: int | None = None
    #: How the client cap held arrivals back (None: it did not, or the file cannot tell;
    #: see :func:`sdplan.runs.screen.held_back`).
    held_back_by_cap: str | None = None
    #: Share of an open loop's consecutive gaps between *scheduled* sends that repeat the gap before exactly
    #: (GuideLLM records the schedule; see :func:`sdplan.runs.guidellm.repeated_gap_share`); None where the file
    #: has no schedule.
    repeated_gaps: float | None = None
    #: Client worker processes that drew the schedule (GuideLLM ``strategy.worker_count``), if recorded.
    client_workers: int | None = None
    #: How far an open loop's client fell behind its own schedule with no cap reached, if it did: GuideLLM from
    #: its recorded schedule, vLLM from bursts of sends (:func:`sdplan.runs.screen.sent_in_bursts`).
    sent_late: str | None = None
    #: Share of the requests whose streamed answer stalled on the way to the client
    #: (:func:`sdplan.runs.screen.stalled_share`); None where the file has no per-request chunk times.
    stalled_streams: float | None = None
    #: The arrival rate an open loop's recorded schedule realised, ``(n - 1)/span`` of its scheduled sends
    #: (req/s; GuideLLM does not rescale its random gaps to the requested rate, vLLM does); None: not recorded.
    scheduled_rate_rps: float | None = None
    #: What the file leaves unknown about the run's load (a GuideLLM benchmark without a strategy, or of a kind
    #: sdplan does not know): neither an arrival rate nor a number of clients, so it is left out of fits.
    unknown_load: str | None = None
    #: Where the file shows SD was on but not its draft length (an InferenceX SD row, whose ``spec_method`` or
    #: ``spec_decoding`` names the method only; a GuideLLM report with more than one token per streamed iteration): what
    #: shows it. Such a run is left out of fits until ``FILE:k=K`` or ``--draft-length`` gives the length;
    #: read as no SD it would be wrong. None: the draft length is known, or the run has no SD.
    speculation_unrecorded: str | None = None
    #: Drafts vLLM counted over the run (``vllm:spec_decode_num_drafts``), where a metrics window gives them: the
    #: weight that pools per-position acceptance over windows into vLLM's own ratio. None: not recorded.
    spec_decode_drafts: float | None = None

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
            return closed_loop_others(self.concurrency)
        if self.mean_concurrency is not None:
            return self.mean_concurrency
        return self.arrival_rate_rps * self.mean_e2e_latency_s

    @property
    def mean_others_at_first_token(self) -> float:
        return self.others_at_first_token if self.others_at_first_token is not None else self.mean_others

    @property
    def arrival_rate_rps(self) -> float:
        """The rate to predict an open-loop run at: the arrival rate when known.

        The rate its recorded schedule realised when the file has one (a GuideLLM
        ``poisson`` run of 300 requests at 11 req/s scheduled 10.49 req/s), else
        the requested rate (vLLM scales its gaps so that ``n`` requests span
        ``n/lambda``), else the achieved rate.
        """
        if self.scheduled_rate_rps is not None:
            return self.scheduled_rate_rps
        return self.requested_rate_rps if self.requested_rate_rps is not None else self.achieved_rate_rps


def check_domain(run: BenchmarkRun, where: str) -> BenchmarkRun:
    """``run`` if its lengths, rates and latencies lie within :mod:`sdplan.limits`' domain bounds.

    The readers check that numbers are finite and positive; a value that is finite but past any real
    server (a mean prompt of 1e306 tokens, a request rate of 1e308 req/s) would overflow the fit's
    products into inf and NaN, so it is refused here, naming the file and the quantity.

    Raises
    ------
    InputFileError
        Naming ``where`` and the quantity out of bounds.
    """
    bounds = (("mean prompt length", run.prompt_tokens, MAX_TOKENS, "tokens"),
              ("mean output length", run.output_tokens, MAX_TOKENS, "tokens"),
              ("request rate", run.requested_rate_rps, MAX_RATE_RPS, "req/s"),
              ("achieved rate", run.achieved_rate_rps, MAX_RATE_RPS, "req/s"),
              ("mean E2E latency", run.mean_e2e_latency_s, MAX_LATENCY_S, "s"),
              ("mean TTFT", run.mean_ttft_s, MAX_LATENCY_S, "s"))
    for quantity, value, bound, unit in bounds:
        if value is not None and math.isfinite(value) and value > bound:
            raise InputFileError(where, None, f"{quantity} of {value:.3g} {unit} is past any real server (at most "
                                              f"{bound:g} {unit}): check the field it comes from")
    return run


def read_text(path: Path) -> str:
    """A result file's text: UTF-8 (a byte-order mark allowed) or UTF-16 with its mark; one-line errors else."""
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
        if encoding == "utf-16" and data[:2] not in (b"\xff\xfe", b"\xfe\xff"):
            break
        return text
    raise InputFileError(name, None, "not UTF-8 text; save the file as UTF-8")


def file_digest(path: Path) -> str:
    """``sha256:<hex>`` of a file (or of a sweep folder's run files), recorded as a fit's provenance."""
    digest = hashlib.sha256()
    if path.is_dir():
        for member in sorted(sweep_files(path)):
            digest.update(member.relative_to(path).as_posix().encode())
            digest.update(member.read_bytes())
    else:
        with path.open("rb") as stream:  # in pieces: a metrics file may be gigabytes
            for piece in iter(lambda: stream.read(1 << 20), b""):
                digest.update(piece)
    return "sha256:" + digest.hexdigest()


def is_finite_number(value: Any) -> bool:
    """Whether a decoded JSON value is a finite real number (``true``/``false`` are not numbers)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def number(value: Any, path: str, key: str, *, allow_inf: bool = False) -> float:
    """A required number of a result file (a numeric string too); anything else names the file and field.

    Raises
    ------
    InputFileError
        If ``value`` is missing, not a number, NaN, or infinite (unless ``allow_inf``).
    """
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


def optional_number(value: Any, path: str, key: str, *, allow_inf: bool = False) -> float | None:
    """:func:`number`, or None where the file leaves ``value`` out (None)."""
    return None if value is None else number(value, path, key, allow_inf=allow_inf)


def count(value: Any, path: str, key: str) -> int:
    """A whole number >= 0 of a result file (a request count)."""
    whole = number(value, path, key)
    if whole < 0 or whole != int(whole):
        raise InputFileError(path, key, f"expected a whole number >= 0, got {whole:g}")
    return int(whole)


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
    times, in_flight = in_flight_timeline(all_start, all_length)
    area = np.concatenate([[0.0], np.cumsum(in_flight[:-1] * np.diff(times))])
    covered = np.interp(start + window, times, area) - np.interp(start, times, area)
    return float(np.mean(covered / window - 1.0))


def in_flight_timeline(start: Any, length: Any) -> tuple[Any, Any]:
    """Event times (starts and ends, sorted) and the number of requests in flight just after each.

    At one instant an end counts before a start, so a request sent the moment another finished is
    never counted together with it.
    """
    times = np.concatenate([start, start + length])
    steps = np.concatenate([np.ones_like(start), -np.ones_like(start)])
    order = np.lexsort((steps, times))
    return times[order], np.cumsum(steps[order])


def percentile_fields(values: list[float], name: str) -> list[tuple[str, float]]:
    """``[(f"{name}_p50_s", p50), (..._p90_s, p90), (..._p99_s, p99)]`` of the finite ``values``."""
    array = np.asarray(values, dtype=np.float64)
    array = array[np.isfinite(array)]
    if array.size == 0:
        return []
    return [(f"{name}_p{q}_s", float(np.percentile(array, q))) for q in (50, 90, 99)]


def sweep_files(folder: Path) -> list[Path]:
    """The run files of a results folder (``vllm bench sweep`` output, ``sdplan calibrate --results-dir``)."""
    return sorted(p for p in folder.rglob("*.json")
                  if p.name not in SWEEP_SKIP and not p.name.startswith("warmup")
                  and not p.name.endswith(".failure.json") and p.is_file())


def full_load_share(starts: list[float], latencies: list[float], clients: int) -> float | None:
    """Share of a closed loop's duration, first send to last completion, with all ``clients`` requests in flight.

    The rest is its ramp-up (clients whose requests are not yet sent) and its drain (clients with no request
    left to send while the last ones finish): ``n`` requests of ``N`` clients are ``n/N`` waves, and with
    lengths +-25% around the mean the last wave's requests end over about half a latency. The fit takes
    each request's measured others in flight (:func:`others_in_flight`), drain included; completed/duration
    of a point of few waves under-states the throughput the clients sustain while all are busy. None with
    fewer than two requests or no duration.
    """
    start = np.asarray(starts, dtype=np.float64)
    length = np.asarray(latencies, dtype=np.float64)
    if start.size < 2 or start.size != length.size or clients < 1:
        return None
    times, in_flight = in_flight_timeline(start, length)
    duration = float(times[-1] - times[0])
    if duration <= 0:
        return None
    full = float(np.sum(np.diff(times) * (in_flight[:-1] >= clients)))
    return full / duration


def peak_in_flight(starts: list[float], latencies: list[float]) -> int:
    """Most requests in flight at once (:func:`in_flight_timeline`)."""
    return int(in_flight_timeline(np.asarray(starts, dtype=np.float64),
                                   np.asarray(latencies, dtype=np.float64))[1].max())
