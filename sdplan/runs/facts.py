"""What result files do not say: draft length and acceptance given per file or by flags."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

from sdplan.errors import InvalidValueError
from sdplan.inputs.acceptance import AcceptanceMetric, alpha_from_mean_length, make_acceptance
from sdplan.units import Dimension, parse_quantity

if TYPE_CHECKING:
    from sdplan.runs.record import BenchmarkRun


@dataclass(frozen=True, slots=True)
class RunFacts:
    """Draft length and acceptance to fill in where a file does not record them."""

    draft_length: int | None = None
    alpha: float | None = None

    def force(self, run: BenchmarkRun) -> BenchmarkRun:
        """Per-file facts (``FILE:k=4,alpha=0.8``) are explicit: they set what they name."""
        if self.draft_length is not None:
            run = _with_draft_length(run, self.draft_length)
            run = replace(run, records_draft_length=True)
        if self.alpha is not None and run.draft_length > 0:
            run = replace(run, alpha=self.alpha, position_rates=None, records_acceptance=True)
        if run.draft_length == 0:
            run = replace(run, alpha=None, mean_acceptance_length=None, position_rates=None)
        return run

    def fill(self, run: BenchmarkRun) -> BenchmarkRun:
        """Fill in only what ``run``'s file does not record (B5: flags never relabel a recorded run)."""
        if self.draft_length is not None and not run.records_draft_length:
            run = _with_draft_length(run, self.draft_length)
        if self.alpha is not None and run.draft_length > 0 and not run.records_acceptance:
            run = replace(run, alpha=self.alpha)
        if run.draft_length == 0:
            run = replace(run, alpha=None, mean_acceptance_length=None, position_rates=None)
        return run


def _with_draft_length(run: BenchmarkRun, k: int) -> BenchmarkRun:
    """``run`` at draft length ``k`` given from outside the file, its alpha from the acceptance length it records.

    A file may record the mean acceptance length (tokens per cycle, bonus included) but not the draft
    length (an InferenceX row without ``num_speculative_tokens``, a GuideLLM report's tokens per streamed
    iteration); with ``k`` given, ``alpha`` solves ``E(alpha, k) = length``
    (:func:`sdplan.inputs.acceptance.alpha_from_mean_length`).
    """
    run = replace(run, draft_length=k, speculation_unrecorded=None)
    tau = run.mean_acceptance_length
    if k > 0 and run.alpha is None and tau is not None:
        if 1.0 <= tau <= k + 1:
            run = replace(run, alpha=float(alpha_from_mean_length(tau, k)), records_acceptance=True)
        else:
            run = replace(run, notes=run.notes + (f"its mean acceptance length {tau:.3g} tokens per cycle does not "
                                                  f"fit draft length {k} (at most {k + 1}): check k",))
    return run


def split_file_facts(argument: str) -> tuple[str, RunFacts | None]:
    """``FILE[:k=K,alpha=A|len=L|rate=R%]`` → the path and its per-file facts.

    ``len`` is vLLM's mean acceptance length at ``k`` and ``rate`` its draft
    acceptance rate; both are converted to the per-token alpha.
    """
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
