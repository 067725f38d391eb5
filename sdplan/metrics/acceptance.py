"""The calibration's ``[acceptance]`` from metrics windows: vLLM's own SD counters, pooled as vLLM pools them."""

from __future__ import annotations

from collections.abc import Sequence

from sdplan.inputs.acceptance import alpha_from_mean_length, measured_acceptance_table
from sdplan.runs.record import BenchmarkRun


def is_window(run: BenchmarkRun) -> bool:
    """Whether a run is a window of metrics (:func:`window_run`), not a benchmark run."""
    return bool(run.notes) and run.notes[0].startswith("metrics window")


def acceptance_document(runs: Sequence[BenchmarkRun]) -> dict[str, object] | None:
    """``[acceptance]`` from the SD counters of metrics windows at their largest draft length, or None (no SD).

    Pooled over the windows as vLLM pools them: per position ``r_i = sum accepted_i / sum drafts`` (each
    window's rate times its drafts), the mean acceptance length ``1 + sum accepted / sum drafts``, and the
    per-token ``alpha`` with that length at ``K``. The schema's per-position rates are conditional,
    ``a_i = r_i / r_(i-1)``.
    """

    spec = [r for r in runs if is_window(r) and r.draft_length > 0 and r.spec_decode_drafts]
    if not spec:
        return None
    k = max(r.draft_length for r in spec)
    at_k = [r for r in spec if r.draft_length == k]
    drafts = sum(r.spec_decode_drafts or 0.0 for r in at_k)
    accepted = sum(((r.mean_acceptance_length or 1.0) - 1.0) * (r.spec_decode_drafts or 0.0) for r in at_k)
    length = 1.0 + accepted / drafts
    text = f"mean acceptance length {length:.4f}"
    with_positions = [r for r in at_k if r.position_rates is not None and len(r.position_rates) == k]
    cumulative = None
    if with_positions:
        weight = sum(r.spec_decode_drafts or 0.0 for r in with_positions)
        cumulative = [sum((r.position_rates or ())[i] * (r.spec_decode_drafts or 0.0) for r in with_positions)
                      / weight for i in range(k)]
        text += ", per position " + ", ".join(f"{rate:.4f}" for rate in cumulative)
    coverages = [(r.draft_coverage, r.spec_decode_drafts or 0.0) for r in at_k if r.draft_coverage is not None]
    coverage = sum(c * w for c, w in coverages) / sum(w for _, w in coverages) if coverages else None
    document, coverage_text = measured_acceptance_table(float(alpha_from_mean_length(length, k)), k, cumulative,
                                                        coverage)
    text += coverage_text
    document["source"] = (f"vLLM's spec_decode counters over {len(at_k)} metrics window(s) at k={k} "
                          f"({round(drafts)} drafts): {text}; the served traffic's prompts and temperature")
    return document
