"""The workload a plan is for: prompt and output lengths and acceptance.

Resolves what the user gave (any of the three acceptance metrics, or none)
against a calibration's defaults, so every command applies the same rules:

* lengths default to the calibration's reference workload;
* acceptance defaults to the calibration's measured acceptance, else to
  :data:`DEFAULT_ALPHA`, and the output says which one was used.
"""

from __future__ import annotations

import csv
import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

from sdplan.errors import InputFileError, InvalidValueError
from sdplan.inputs.acceptance import AcceptanceMetric, AcceptanceSpec, make_acceptance, position_rates_from_conditional
from sdplan.inputs.speculation_profile import load_speculation_profile
from sdplan.limits import MAX_BATCH_SIZE, MAX_DRAFT_LENGTH, MAX_TOKENS
from sdplan.schema import Field, Table, decode_text, read_toml, validate

if TYPE_CHECKING:
    from sdplan.calibration import Calibration

#: Per-token acceptance assumed when neither the user nor the calibration gives one.
DEFAULT_ALPHA = 0.7


@dataclass(frozen=True, slots=True, kw_only=True)
class Workload:
    """Lengths in tokens and the acceptance they are served with."""

    prompt_tokens: int
    output_tokens: int
    acceptance: AcceptanceSpec


def resolve_acceptance(
    calibration: Calibration,
    *,
    alpha: Sequence[float] | None = None,
    mean_length: Sequence[float] | None = None,
    draft_rate: Sequence[float] | None = None,
    measured_at_k: int | None = None,
    source: str = "command line",
    position_rates: Sequence[float] | None = None,
    profile: str | None = None,
) -> AcceptanceSpec:
    """Acceptance from at most one metric, or the calibration's, or the default.

    ``profile`` is the path of a ``speculation_profile.json``
    (:mod:`sdplan.inputs.speculation_profile`): its per-position rates, counted as one metric.

    Raises
    ------
    InvalidValueError
        If more than one metric is given, ``measured_at_k`` is missing for a
        k-dependent metric (or given for alpha), or a value is out of range.
    """
    given = [
        (metric, values)
        for metric, values in (
            (AcceptanceMetric.PER_TOKEN, alpha),
            (AcceptanceMetric.MEAN_LENGTH, mean_length),
            (AcceptanceMetric.DRAFT_RATE, draft_rate),
            (AcceptanceMetric.PER_POSITION, position_rates),
        )
        if values is not None
    ]
    if len(given) + (profile is not None) > 1:
        raise InvalidValueError(
            "give acceptance in one metric only: --acceptance (per-token alpha), "
            "--acceptance-length, --draft-acceptance-rate, --position-acceptance or --acceptance-profile"
        )
    if profile is not None:
        if measured_at_k is not None:
            raise InvalidValueError("--acceptance-k does not apply to --acceptance-profile (the profile says the "
                                    "draft length it was measured at)")
        return load_speculation_profile(profile).acceptance()
    if given:
        metric, values = given[0]
        if metric in (AcceptanceMetric.PER_TOKEN, AcceptanceMetric.PER_POSITION) and measured_at_k is not None:
            raise InvalidValueError("--acceptance-k applies to --acceptance-length or --draft-acceptance-rate only")
        return make_acceptance(metric, tuple(values), measured_at_k, source)
    if measured_at_k is not None:
        raise InvalidValueError("--acceptance-k needs --acceptance-length or --draft-acceptance-rate")
    measured = calibration.acceptance
    if measured is not None:

        source = f"from the calibration: {measured.source}"
        if measured.per_position_rates:
            spec = make_acceptance(AcceptanceMetric.PER_POSITION, position_rates_from_conditional(
                measured.per_position_rates), None, source)
        else:
            spec = make_acceptance(AcceptanceMetric.PER_TOKEN, (measured.per_token_alpha,), None, source)
        return replace(spec, coverage=measured.draft_coverage)
    return make_acceptance(
        AcceptanceMetric.PER_TOKEN, (DEFAULT_ALPHA,), None, "default assumption; set --acceptance for your workload"
    )


def measured_draft_lengths(acceptance: AcceptanceSpec, draft_lengths: Sequence[int], *,
                           given: bool) -> tuple[list[int], str | None]:
    """The draft lengths the acceptance covers, and a note on those left out.

    Per-position acceptance gives ``E(k)`` only up to the draft length it was measured at
    (``K``). Draft lengths the user gave past ``K`` are an error; of the default candidates,
    those past ``K`` are left out with a note when the rates came from the calibration.

    Raises
    ------
    InvalidValueError
        If a given draft length exceeds ``K``, or none of the candidates is within it.
    """
    only = acceptance.only_draft_length
    if only is not None and any(k not in (0, only) for k in draft_lengths):
        if given and any(k > 0 and k != only for k in draft_lengths):
            raise InvalidValueError(f"the acceptance holds at draft length {only} only ({acceptance.source}); "
                                    f"use --draft-lengths {only}, or give --acceptance ALPHA for other lengths")
        return [only], (f"draft lengths other than {only} left out: the acceptance was measured at k={only} and "
                        "does not carry over to other lengths for this drafter")
    rates = acceptance.position_rates
    if rates is None or max(draft_lengths, default=0) <= len(rates):
        return list(draft_lengths), None
    longest = len(rates)
    kept = [k for k in draft_lengths if k <= longest]
    calibrated = acceptance.source.startswith("from the calibration")
    profiled = acceptance.source.startswith("speculation profile")
    if given or not (calibrated or profiled) or not any(k > 0 for k in kept):
        raise InvalidValueError(
            f"per-position acceptance covers draft lengths 1..{longest} "
            f"({'measured' if calibrated or profiled else 'given'} "
            f"up to k={longest}); use draft lengths within 1-{longest}, or give --acceptance ALPHA to extrapolate "
            "an i.i.d. alpha past it")
    dropped = sorted(k for k in draft_lengths if k > longest)
    contiguous = len(dropped) > 1 and dropped == list(range(dropped[0], dropped[-1] + 1))
    span = f"{dropped[0]}-{dropped[-1]}" if contiguous else ", ".join(map(str, dropped))
    whose = "the calibration" if calibrated else "the speculation profile"
    return kept, (f"draft lengths {span} left out: {whose} measured acceptance per draft position up to "
                  f"k={longest}; give --acceptance ALPHA to extrapolate an i.i.d. alpha past it")


def resolve_workload(
    calibration: Calibration,
    *,
    prompt_tokens: int | None = None,
    output_tokens: int | None = None,
    alpha: Sequence[float] | None = None,
    mean_length: Sequence[float] | None = None,
    draft_rate: Sequence[float] | None = None,
    measured_at_k: int | None = None,
    source: str = "command line",
    position_rates: Sequence[float] | None = None,
    profile: str | None = None,
) -> Workload:
    """The workload with every default applied (see the module docstring)."""
    prompt = prompt_tokens if prompt_tokens is not None else calibration.reference_prompt_tokens
    output = output_tokens if output_tokens is not None else calibration.reference_output_tokens
    if prompt < 1 or output < 1:
        raise InvalidValueError("prompt and output lengths must be >= 1 token")
    acceptance = resolve_acceptance(
        calibration,
        alpha=alpha,
        mean_length=mean_length,
        draft_rate=draft_rate,
        measured_at_k=measured_at_k,
        source=source,
        position_rates=position_rates,
        profile=profile,
    )
    return Workload(prompt_tokens=int(prompt), output_tokens=int(output), acceptance=acceptance)


# ----------------------------------------------------------------------------- workload files

WORKLOAD_SCHEMA_VERSION = 1


def _workload_schema() -> object:
    return Table(
        {
            "schema_version": Field("int", f"workload schema version; this sdplan reads {WORKLOAD_SCHEMA_VERSION}"),
            "name": Field("str", "short identifier", required=False),
            "description": Field("str", "free text", required=False),
            "calibration": Field("str", "calibration file (relative to this file) or shipped name", required=False),
            "slos": Field("str_list", 'SLO expressions, e.g. ["e2e:mean<=2s", "tpot:mean<=40ms"]', required=False),
            "traffic": Table(
                {
                    "request_rate_rps": Field("float", "request rate to check, req/s", required=False, minimum=0.0),
                    "concurrency": Field("int", "clients kept in flight to check (a closed loop), instead of a "
                                         "request rate", required=False, minimum=1, maximum=1_000_000),
                    "num_prompts": Field("int", "requests the closed-loop run sends in all (vllm bench serve "
                                         "--num-prompts), whose opening wave its means include", required=False,
                                         minimum=1, maximum=1_000_000_000),
                    "target_rate_rps": Field("float", "total rate to size the fleet for, req/s", required=False,
                                             minimum=0.0),
                    "target_concurrency": Field("int", "total clients kept in flight to size the fleet for (a "
                                                "closed loop: capacity answers in clients), instead of a rate",
                                                required=False, minimum=1, maximum=1_000_000_000),
                    "prompt_tokens": Field("int", "prompt length, tokens", required=False, minimum=1,
                                           maximum=MAX_TOKENS),
                    "output_tokens": Field("int", "output length, tokens", required=False, minimum=1,
                                           maximum=MAX_TOKENS),
                },
                required=False,
            ),
            "acceptance": Table(
                {
                    "per_token_alpha": Field("float", "per-token acceptance", required=False, minimum=0.0,
                                             maximum=1.0),
                    "mean_length": Field("float", "mean acceptance length, tokens per cycle incl. bonus",
                                         required=False, minimum=1.0),
                    "draft_rate": Field("float", "fraction of drafted tokens accepted", required=False,
                                        minimum=0.0, maximum=1.0),
                    "measured_at_k": Field("int", "draft length the acceptance was measured at", required=False,
                                           minimum=1, maximum=MAX_DRAFT_LENGTH),
                    "position_rates": Field("float_list", "vLLM's per-position acceptance rates r_1..r_K",
                                            required=False, minimum=0.0, maximum=1.0),
                    "profile": Field("str", "speculation_profile.json (relative to this file)", required=False),
                },
                required=False,
            ),
            "speculation": Table(
                {
                    "mode": Field("str", "how k is chosen", required=False, choices=("best", "fixed", "off")),
                    "draft_length": Field("int", "k when mode = fixed", required=False, minimum=1,
                                          maximum=MAX_DRAFT_LENGTH),
                    "draft_lengths": Field("float_list", "candidate k when mode = best", required=False, minimum=1,
                                           maximum=MAX_DRAFT_LENGTH),
                },
                required=False,
            ),
            "deployment": Table(
                {
                    "gpus_per_replica": Field("int", "GPUs per serving replica", required=False, minimum=1,
                                              maximum=1_000_000),
                    "gpu_hour_cost_usd": Field("float", "cost of one GPU-hour, USD", required=False, minimum=0.0,
                                               maximum=1e6),
                    "max_batch_size": Field("int", "vLLM max_num_seqs", required=False, minimum=1,
                                            maximum=MAX_BATCH_SIZE),
                },
                required=False,
            ),
        }
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class WorkloadFile:
    """A validated workload file; every field is optional and CLI flags override it."""

    path: str
    calibration: str | None = None
    slos: tuple[str, ...] = ()
    request_rate_rps: float | None = None
    concurrency: int | None = None
    num_prompts: int | None = None
    target_rate_rps: float | None = None
    target_concurrency: int | None = None
    prompt_tokens: int | None = None
    output_tokens: int | None = None
    alpha: float | None = None
    mean_length: float | None = None
    draft_rate: float | None = None
    measured_at_k: int | None = None
    position_rates: tuple[float, ...] | None = None
    profile: str | None = None
    mode: str | None = None
    draft_length: int | None = None
    draft_lengths: tuple[int, ...] | None = None
    gpus_per_replica: int | None = None
    gpu_hour_cost_usd: float | None = None
    max_batch_size: int | None = None


def load_workload_file(path: str) -> WorkloadFile:
    """Read and validate a workload TOML file (``sdplan-workload(5)``).

    A relative ``calibration`` path is resolved against the file's folder; a
    value that is not an existing path is kept as a shipped calibration name.
    """
    file = Path(path)
    document = read_toml(file)
    version = document.get("schema_version")
    if isinstance(version, int) and not isinstance(version, bool) and version != WORKLOAD_SCHEMA_VERSION:
        raise InputFileError(path, "schema_version",
                             f"version {version} is not supported; this sdplan reads {WORKLOAD_SCHEMA_VERSION}")
    validate(document, _workload_schema(), path)  # type: ignore[arg-type]
    acceptance = document.get("acceptance", {})
    metrics = [key for key in ("per_token_alpha", "mean_length", "draft_rate", "position_rates", "profile")
               if key in acceptance]
    if len(metrics) > 1:
        raise InputFileError(path, "acceptance", "give one of per_token_alpha, mean_length, draft_rate, "
                             f"position_rates, profile, not {metrics}")
    if metrics and metrics[0] in ("mean_length", "draft_rate") and "measured_at_k" not in acceptance:
        raise InputFileError(path, "acceptance.measured_at_k",
                             f"{metrics[0]} needs the draft length it was measured at")
    speculation = document.get("speculation", {})
    if speculation.get("mode") == "fixed" and "draft_length" not in speculation:
        raise InputFileError(path, "speculation.draft_length", 'mode = "fixed" needs draft_length')
    lengths = speculation.get("draft_lengths")
    if lengths is not None and any(int(k) != k for k in lengths):
        raise InputFileError(path, "speculation.draft_lengths", "draft lengths must be integers")
    if lengths is not None and len(lengths) > 100_000:
        raise InputFileError(path, "speculation.draft_lengths", "at most 100000 candidate draft lengths")
    calibration = document.get("calibration")
    if calibration is not None:
        relative = file.parent / calibration
        try:
            if relative.exists():
                calibration = str(relative)
        except OSError as error:
            raise InputFileError(path, "calibration", f"cannot look up {str(relative)!r} ({error.strerror}); "
                                 "check the path") from None
    profile = acceptance.get("profile")
    if profile is not None:
        profile = str(file.parent / profile)
    traffic = document.get("traffic", {})
    if "request_rate_rps" in traffic and "concurrency" in traffic:
        raise InputFileError(path, "traffic.concurrency", "give request_rate_rps (an open loop) or concurrency (a "
                             "closed loop of clients), not both")
    if "num_prompts" in traffic and "concurrency" not in traffic:
        raise InputFileError(path, "traffic.num_prompts", "the requests a closed-loop run sends: give "
                             "traffic.concurrency with it, or drop it")
    if traffic.get("num_prompts", math.inf) < traffic.get("concurrency", 0):
        raise InputFileError(path, "traffic.num_prompts", f"{traffic['num_prompts']} is fewer than the "
                             f"{traffic['concurrency']} clients of traffic.concurrency: a run sends every client's "
                             "first request at once")
    if "target_rate_rps" in traffic and "target_concurrency" in traffic:
        raise InputFileError(path, "traffic.target_concurrency", "give target_rate_rps (a fleet for a request rate) "
                             "or target_concurrency (a fleet for clients in flight), not both")
    deployment = document.get("deployment", {})
    return WorkloadFile(
        path=path,
        calibration=calibration,
        slos=tuple(document.get("slos", ())),
        request_rate_rps=traffic.get("request_rate_rps"),
        concurrency=traffic.get("concurrency"),
        num_prompts=traffic.get("num_prompts"),
        target_rate_rps=traffic.get("target_rate_rps"),
        target_concurrency=traffic.get("target_concurrency"),
        prompt_tokens=traffic.get("prompt_tokens"),
        output_tokens=traffic.get("output_tokens"),
        alpha=acceptance.get("per_token_alpha"),
        mean_length=acceptance.get("mean_length"),
        draft_rate=acceptance.get("draft_rate"),
        measured_at_k=acceptance.get("measured_at_k"),
        position_rates=tuple(acceptance["position_rates"]) if "position_rates" in acceptance else None,
        profile=profile,
        mode=speculation.get("mode"),
        draft_length=speculation.get("draft_length"),
        draft_lengths=tuple(int(k) for k in lengths) if lengths is not None else None,
        gpus_per_replica=deployment.get("gpus_per_replica"),
        gpu_hour_cost_usd=deployment.get("gpu_hour_cost_usd"),
        max_batch_size=deployment.get("max_batch_size"),
    )


# ----------------------------------------------------------------------------- length histograms

#: Most rows a lengths file may have (a histogram, not a trace of every request).
MAX_LENGTH_ROWS = 1_000_000


def load_lengths_file(path: str) -> tuple[list[float], list[float], list[float]]:
    """Read a histogram of request lengths: CSV ``prompt_tokens,output_tokens[,weight]``.

    UTF-8 (with or without a byte-order mark) and UTF-16/32 with a
    byte-order mark are read; other encodings are refused with a message.
    Lengths must be whole-ish numbers in ``[1, MAX_TOKENS]``, weights finite
    and ``>= 0`` with a positive total.

    Returns
    -------
    (prompts, outputs, weights) : tuple of lists

    Raises
    ------
    InputFileError
        Naming the file and the line of the first problem.
    """
    try:
        raw = Path(path).read_bytes()
    except IsADirectoryError:
        raise InputFileError(path, None, "is a folder; pass a CSV file") from None
    except OSError as error:
        raise InputFileError(path, None, f"cannot read ({error.strerror}); check the path") from None
    text = decode_text(raw, path, "CSV")
    try:
        rows = list(csv.DictReader(text.splitlines()))
    except csv.Error as error:
        raise InputFileError(path, None, f"not valid CSV ({error}); write prompt_tokens,output_tokens,weight") from None
    if len(rows) > MAX_LENGTH_ROWS:
        raise InputFileError(path, None, f"{len(rows):,} rows; at most {MAX_LENGTH_ROWS:,} (merge equal lengths "
                             "into one row with a weight)")
    prompts, outputs, weights = [], [], []
    for line, row in enumerate(rows, start=2):
        try:
            p, g, w = float(row["prompt_tokens"]), float(row["output_tokens"]), float(row.get("weight") or 1)
        except (KeyError, TypeError, ValueError):
            raise InputFileError(path, f"line {line}", "expected prompt_tokens,output_tokens[,weight] numbers "
                                 "under a header line prompt_tokens,output_tokens,weight") from None
        if not all(math.isfinite(value) for value in (p, g, w)):
            raise InputFileError(path, f"line {line}", "lengths and weights must be finite numbers")
        if not (1 <= p <= MAX_TOKENS and 1 <= g <= MAX_TOKENS) or w < 0:
            raise InputFileError(path, f"line {line}",
                                 f"lengths must be between 1 and {MAX_TOKENS} tokens and weights >= 0")
        prompts.append(p)
        outputs.append(g)
        weights.append(w)
    biggest = max(weights, default=0.0)
    if not biggest > 0:
        raise InputFileError(path, None, "no rows with positive weight; add prompt_tokens,output_tokens,weight rows")
    return prompts, outputs, [w / biggest for w in weights]  # relative weights, <= 1: no sum or mean overflows
