"""The result files ``sdplan fit`` and ``sdplan validate`` start from, as one typed request, and their reading.

Both commands take benchmark result files (or a server's metrics) with the
facts the files may not record (a draft length, one acceptance value). This
module turns that request into :class:`~sdplan.runs.BenchmarkRun` records
with the readers' warnings; the steady-state screen
(:func:`sdplan.fitting.steady_state.screen`) is applied by the use cases after it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from sdplan.errors import InvalidValueError
from sdplan.inputs.acceptance import AcceptanceMetric, make_acceptance
from sdplan.planning.scenario import AcceptanceGiven
from sdplan.runs import BenchmarkRun, load_runs
from sdplan.runs.silicon import Selection


@dataclass(frozen=True, slots=True, kw_only=True)
class ResultFiles:
    """The result files and what they may not say, as given (``sdplan-fit(1)``, ``sdplan-validate(1)``).

    ``results`` are paths, folders or ``aic:silicon_sample``, each optionally with per-file facts
    (``FILE:k=4,len=2.8``); ``select`` the ``KEY=VALUE[,...]`` texts of ``--select``; ``window_s`` the
    metrics windows (None: auto); ``draft_length`` and ``acceptance`` fill in only what a file does not
    record.
    """

    results: tuple[str, ...]
    input_format: str = "auto"
    select: tuple[str, ...] = ()
    window_s: float | None = None
    draft_length: int | None = None
    acceptance: AcceptanceGiven = field(default_factory=AcceptanceGiven)


def result_alpha(given: AcceptanceGiven) -> float | None:
    """One per-token alpha from the acceptance given for result files, or None when none is given.

    A fit takes one alpha per run, so exactly one value in one metric; a mean
    acceptance length or draft rate needs the draft length it was measured at
    (:func:`sdplan.inputs.acceptance.make_acceptance` converts it).

    Raises
    ------
    InvalidValueError
        Per-position rates, more than one metric or value, or ``--acceptance-k`` alone.
    """
    if given.position_rates is not None:
        raise InvalidValueError("--position-acceptance is not used for result files: fits take one alpha per run "
                                "(vLLM files carry their own spec_decode fields)")
    metrics = [(metric, values) for metric, values in ((AcceptanceMetric.PER_TOKEN, given.alpha),
                                                       (AcceptanceMetric.MEAN_LENGTH, given.mean_length),
                                                       (AcceptanceMetric.DRAFT_RATE, given.draft_rate))
               if values is not None]
    if not metrics:
        if given.measured_at_k is not None:
            raise InvalidValueError("--acceptance-k needs --acceptance-length or --draft-acceptance-rate")
        return None
    if len(metrics) > 1:
        raise InvalidValueError("give acceptance in one metric only")
    metric, values = metrics[0]
    if len(values) != 1:
        raise InvalidValueError("give a single acceptance value for result files")
    return make_acceptance(metric, tuple(values), given.measured_at_k, "command line").alphas[0]


def read_runs(files: ResultFiles, alpha: float | None) -> tuple[list[BenchmarkRun], list[str]]:
    """The runs of ``files``, ``alpha`` (:func:`result_alpha`) filling in SD runs that lack one, and the
    readers' warnings (:func:`sdplan.runs.load_runs`)."""
    return load_runs(list(files.results), files.input_format, files.draft_length, alpha,
                     Selection.parse(files.select), files.window_s)
