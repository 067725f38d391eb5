"""InferenceX (SemiAnalysis) benchmark rows as :class:`~sdplan.runs.record.BenchmarkRun` records.

InferenceX publishes one JSON row per (deployment, ISL, OSL, concurrency):
its API returns ``BenchmarkRow`` objects (``packages/db/src/queries/
benchmarks.ts`` in SemiAnalysisAI/InferenceX-app) and its runner writes the
same measurements flat (``utils/process_result.py`` in SemiAnalysisAI/InferenceX).
Both shapes are read, as one object or a JSON array of them:

* the load: a closed loop of ``conc`` clients (``vllm bench serve
  --max-concurrency conc`` at an unbounded rate); ``isl``/``osl`` the prompt and
  output lengths in tokens;
* the latencies, in **seconds**: ``mean_e2el``, ``mean_ttft``, ``mean_tpot`` and
  ``median_*``/``p90_*``/``p99_*``, under ``metrics`` (API) or at the top level
  (runner);
* SD: ``spec_method`` (API) or ``spec_decoding`` (runner), ``"none"`` without
  SD, else the method (``mtp``, ``eagle3``, ...). The draft length is
  ``num_speculative_tokens`` and the acceptance the mean acceptance length in
  tokens per cycle, bonus token included (``acceptance_length``, or
  ``synthetic_acceptance_length``: the "golden" length an arm pins with vLLM's
  synthetic rejection sampler, so it is known exactly), wherever a row carries
  them (top level, ``techniques`` or ``metrics``). Rows without them leave the
  draft length and acceptance to ``FILE:k=K,len=L`` or the flags.

Rows that are not one replica under one closed loop are left out with a
warning: failed rows (``error``), agentic trace replays (no ``isl``/``osl``)
and disaggregated or multi-node deployments (prefill and decode on separate
GPU pools, which the model's single queue does not describe).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sdplan.acceptance import alpha_from_mean_length
from sdplan.errors import InputFileError
from sdplan.limits import MAX_DRAFT_LENGTH, MAX_TOKENS
from sdplan.runs.record import BenchmarkRun, count, is_finite_number, number

#: How :mod:`sdplan.runs.read` names this format (``--input-format inferencex``) and describes it in errors.
NAME = "inferencex"
DESCRIPTION = "InferenceX benchmark rows"
#: Keys that may hold the mean acceptance length (tokens per cycle, bonus token included).
ACCEPTANCE_LENGTH_KEYS = ("acceptance_length", "synthetic_acceptance_length", "spec_decode_acceptance_length")


def _metrics(document: dict[str, Any]) -> dict[str, Any]:
    metrics = document.get("metrics")
    return metrics if isinstance(metrics, dict) else document


def detects(path: Path, document: Any) -> bool:
    """Whether a decoded JSON object is an InferenceX row: ``conc``, ``isl`` and the seconds-valued ``mean_e2el``."""
    return (isinstance(document, dict) and "conc" in document and "isl" in document
            and "mean_e2el" in _metrics(document))


def read(path: str, document: dict[str, Any]) -> tuple[list[BenchmarkRun], list[str]]:
    """The run of one row, or none and a warning saying why it is left out."""
    reason = _left_out(document)
    if reason is not None:
        return [], [f"{path}: left out: {reason}"]
    return [read_row(path, document)], []


def _left_out(document: dict[str, Any]) -> str | None:
    if document.get("error") not in (None, "", False):
        return f"the row records a failed run ({str(document['error'])[:80]})"
    if document.get("isl") is None or document.get("osl") is None:
        return "an agentic trace replay (no isl/osl): no one request length to fit"
    if document.get("disagg") in (True, "true", "True") or document.get("is_multinode") in (True, "true", "True"):
        return ("a disaggregated or multi-node deployment: prefill and decode run on separate GPU pools, which one "
                "replica's queue does not describe")
    return None


def _find(document: dict[str, Any], keys: tuple[str, ...]) -> tuple[str, Any] | None:
    """The first of ``keys`` in the row, its ``techniques`` or its ``metrics``: (where, value)."""
    for table_name in (None, "techniques", "metrics"):
        table = document if table_name is None else document.get(table_name)
        if not isinstance(table, dict):
            continue
        for key in keys:
            if table.get(key) is not None:
                return (f"{table_name}.{key}" if table_name else key), table[key]
    return None


def read_row(path: str, document: dict[str, Any]) -> BenchmarkRun:
    """One closed-loop run from a row (see the module notes).

    Raises
    ------
    InputFileError
        Naming the row and the field, for a missing or malformed value.
    """
    metrics = _metrics(document)
    prefix = "metrics." if metrics is not document else ""
    conc = count(document.get("conc"), path, "conc")
    if conc < 1:
        raise InputFileError(path, "conc", "must be >= 1 (the number of clients of the closed loop)")
    lengths = []
    for key in ("isl", "osl"):
        value = number(document.get(key), path, key)
        if not 1 <= value <= MAX_TOKENS:
            raise InputFileError(path, key, f"must lie in [1, {MAX_TOKENS}] tokens, got {value:g}")
        lengths.append(value)

    def seconds(name: str, required: bool = False) -> float | None:
        value = metrics.get(name)
        if value is None and not required:
            return None
        found = number(value, path, prefix + name)
        if found < 0 or (required and found == 0):
            raise InputFileError(path, prefix + name, f"must be {'> 0' if required else '>= 0'} s, got {found:g}")
        return found

    latency = seconds("mean_e2el", required=True)
    assert latency is not None
    percentiles = []
    for metric, label in (("e2el", "e2e"), ("ttft", "ttft"), ("tpot", "tpot")):
        for q, key in ((50, f"median_{metric}"), (90, f"p90_{metric}"), (99, f"p99_{metric}")):
            if is_finite_number(metrics.get(key)) and metrics[key] >= 0:
                percentiles.append((f"{label}_p{q}_s", float(metrics[key])))
    method = str(document.get("spec_method", document.get("spec_decoding", "none")) or "none").strip().lower()
    k, alpha, tau, notes = 0, None, None, []
    records_k = method == "none"
    if method != "none":
        notes.append(f"SD method {method[:40]}")
        found_k = _find(document, ("num_speculative_tokens",))
        if found_k is not None:
            k = count(found_k[1], path, found_k[0])
            if not 1 <= k <= MAX_DRAFT_LENGTH:
                raise InputFileError(path, found_k[0], f"must lie in [1, {MAX_DRAFT_LENGTH}], got {k}")
            records_k = True
        found_tau = _find(document, ACCEPTANCE_LENGTH_KEYS)
        if found_tau is not None:
            tau = number(found_tau[1], path, found_tau[0])
            top = k + 1 if k else MAX_DRAFT_LENGTH + 1
            if not 1.0 <= tau <= top:
                raise InputFileError(path, found_tau[0], f"mean acceptance length must lie in [1, {top}] tokens "
                                     f"per cycle{f' at k={k}' if k else ''} (bonus token included), got {tau:g}")
            if k:
                alpha = float(alpha_from_mean_length(tau, k))
    name = Path(path.split("#")[0]).name + ("#" + path.split("#")[1] if "#" in path else "")
    return BenchmarkRun(
        source=name, requested_rate_rps=None, achieved_rate_rps=conc / latency, concurrency=conc,
        draft_length=k, alpha=alpha, mean_acceptance_length=tau, prompt_tokens=lengths[0], output_tokens=lengths[1],
        mean_e2e_latency_s=latency, mean_ttft_s=seconds("mean_ttft"), mean_tpot_s=seconds("mean_tpot"),
        percentiles_s=tuple(percentiles), records_draft_length=records_k, records_acceptance=alpha is not None,
        notes=tuple(notes),
        speculation_unrecorded=None if records_k else f"spec_method {method[:40]} without num_speculative_tokens",
    )
