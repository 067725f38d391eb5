"""InferenceX (SemiAnalysis) benchmark rows as :class:`~sdplan.runs.record.BenchmarkRun` records.

InferenceX publishes one JSON row per (deployment, ISL, OSL, concurrency), in two shapes, read here as one
object or a JSON array of them (``tests/data/inferencex/README.md`` cites the code, by commit):

* the runner's flat row (``utils/process_result.py`` in SemiAnalysisAI/InferenceX): the deployment from the
  runner's environment (``hw``, ``framework``, ``precision``, ``spec_decoding``, ``tp``, ...) beside
  ``vllm bench serve``'s measurements, every ``*_ms`` key renamed without ``_ms`` and in seconds;
* the API's ``BenchmarkRow`` (``packages/db/src/queries/benchmarks.ts`` in SemiAnalysisAI/InferenceX-app):
  the deployment at the top level (``spec_method`` for ``spec_decoding``) and the measurements under
  ``metrics``.

What a row says: a closed loop of ``conc`` clients (``vllm bench serve --max-concurrency conc`` at an
unbounded rate); ``isl``/``osl`` the *configured* prompt and output lengths in tokens (the runs draw random
lengths around them); ``mean_e2el``, ``mean_ttft``, ``mean_tpot`` and ``median_*``/``p90_*``/``p99_*`` in
seconds; and SD only as the method, ``spec_decoding``/``spec_method`` (``"none"`` or empty without SD, else
``mtp``, ``eagle3``, ...). No row records the draft length (``num_speculative_tokens`` is in the recipe
script the row's ``recipe_fingerprint`` names) or the acceptance (``process_result.py`` keeps only the
``*_ms`` keys of vLLM's result, so its ``spec_decode_*`` counters are dropped). An SD row is therefore read
with :attr:`~sdplan.runs.record.BenchmarkRun.speculation_unrecorded` set, and the steady-state screen leaves
it out, saying how to give both: ``FILE:k=K,len=L`` for a file of one SD arm (a runner row, or an array of
one arm), or ``--draft-length K`` with ``--acceptance-length L --acceptance-k K`` for an array that mixes
arms (the flags fill in only the SD rows; ``FILE:k=K`` would set ``K`` on every row of the file). Where an
arm pinned its acceptance with a synthetic sampler, ``L`` is that arm's golden length
(``golden_al_distribution/`` in SemiAnalysisAI/InferenceX); otherwise the server's own counters
(``vllm:spec_decode_*``) of the run give it.

Rows that are not one replica under one closed loop are left out with a warning: failed rows (``error``),
agentic trace replays (no ``isl``/``osl``) and disaggregated or multi-node deployments (prefill and decode on
separate GPU pools, which the model's single queue does not describe).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sdplan.errors import InputFileError
from sdplan.limits import MAX_TOKENS
from sdplan.runs.record import BenchmarkRun, count, is_finite_number, number

#: How :mod:`sdplan.runs.read` names this format (``--input-format inferencex``) and describes it in errors.
NAME = "inferencex"
DESCRIPTION = "InferenceX benchmark rows"


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


def _spec_method(document: dict[str, Any]) -> str:
    """The SD method, lower case: ``spec_method`` (API) or ``spec_decoding`` (runner); ``none`` when empty."""
    value = document.get("spec_method", document.get("spec_decoding"))
    if value in (None, False):
        return "none"
    return str(value).strip().lower() or "none"


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
    method = _spec_method(document)
    notes = [] if method == "none" else [f"SD method {method[:40]}"]
    name = Path(path.split("#")[0]).name + ("#" + path.split("#")[1] if "#" in path else "")
    return BenchmarkRun(
        source=name, requested_rate_rps=None, achieved_rate_rps=conc / latency, concurrency=conc,
        draft_length=0, alpha=None, mean_acceptance_length=None, prompt_tokens=lengths[0], output_tokens=lengths[1],
        mean_e2e_latency_s=latency, mean_ttft_s=seconds("mean_ttft"), mean_tpot_s=seconds("mean_tpot"),
        percentiles_s=tuple(percentiles), records_draft_length=method == "none", records_acceptance=False,
        notes=tuple(notes),
        speculation_unrecorded=None if method == "none" else (
            f"{'spec_method' if 'spec_method' in document else 'spec_decoding'} {method[:40]}; InferenceX rows do "
            "not record num_speculative_tokens or the acceptance"),
    )
