"""``sdplan fit``'s use case: a calibration fitted to result files, or a calibration scaled to them.

:func:`fit_runs` takes one typed :class:`FitRequest` and returns the
calibration's text with everything its report shows; the CLI renders the
report and writes both. The workflow, in order:

1. the runs are read (:mod:`sdplan.measure.result_files`) and screened
   (:func:`sdplan.fitting.steady_state.screen`); too few kept runs is an error before
   any hold-out, so that the counts are the screen's;
2. with ``prior``, the prior is scaled to the kept runs instead
   (:func:`sdplan.metrics.prior.scale_prior`) and nothing is fitted;
3. otherwise a seeded fraction or the most loaded run of each configuration
   is held out (``holdout``, ``holdout_by``), the rest fitted pooled and per
   configuration (:mod:`sdplan.fitting.fit`), the held-out runs validated, and the
   calibration document built with its provenance (the options given, the
   sources' digests, the counts; AIConfigurator's rows fill in what the
   options left unknown) and checked as ``sdplan`` reads calibrations.
"""

from __future__ import annotations

import datetime
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sdplan import __version__
from sdplan.calibration import parse_calibration, resolve_calibration
from sdplan.errors import InfeasibleError, InvalidValueError, NoLoadCostError
from sdplan.fileio import dumps_toml
from sdplan.fitting.fit import MIN_FIT_RUNS, fit_configurations, fit_pooled, fitted_document, holdout_split
from sdplan.fitting.steady_state import screen
from sdplan.fitting.validation import validate
from sdplan.measure.result_files import ResultFiles, read_runs, result_alpha
from sdplan.metrics.acceptance import acceptance_document
from sdplan.metrics.prior import scale_prior
from sdplan.runs import BenchmarkRun, file_digest, silicon, split_file_facts

if TYPE_CHECKING:
    from sdplan.fitting.fit import ConfigurationFit
    from sdplan.fitting.fit_result import PooledFit
    from sdplan.fitting.validation import Validation
    from sdplan.metrics.prior import PriorScaling

#: A run left out, with why (the screen's reasons joined by "; ").
Dropped = tuple[BenchmarkRun, str]


@dataclass(frozen=True, slots=True, kw_only=True)
class ProvenanceGiven:
    """The provenance options as given; "unknown ..." where not (AIConfigurator's rows may fill them in)."""

    hardware: str
    target_model: str
    draft_model: str
    engine_version: str

    def table(self) -> dict[str, str]:
        """The keys in the order the calibration's ``[provenance]`` writes them."""
        return {"hardware": self.hardware, "target_model": self.target_model,
                "engine_version": self.engine_version, "draft_model": self.draft_model}


@dataclass(frozen=True, slots=True, kw_only=True)
class FitRequest:
    """What ``sdplan fit`` was given.

    ``output`` is the calibration file to write, None for standard output;
    ``holdout`` a fraction of the runs to hold out at random (seeded by
    ``seed``), or ``holdout_by="highest-load"``; ``prior`` a calibration to scale
    to the runs instead of fitting one.
    """

    files: ResultFiles
    output: Path | None
    name: str | None
    given: ProvenanceGiven
    holdout: float | None = None
    holdout_by: str = "random"
    seed: int = 0
    prior: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class Fitted:
    """A fitted calibration (``calibration_toml``, its document) and what its report shows.

    ``kept`` are the runs fitted (the held-out ones excluded), ``dropped`` those the screen left out, ``holdout``
    the validation on the held-out runs (None without a hold-out); ``written`` the file named in the report
    (``-``: standard output).
    """

    document: dict[str, Any]
    calibration_toml: str
    written: str
    pooled: PooledFit
    configurations: list[ConfigurationFit]
    kept: list[BenchmarkRun]
    dropped: list[Dropped]
    holdout: Validation | None
    warnings: list[str]


@dataclass(frozen=True, slots=True, kw_only=True)
class Scaled:
    """A prior scaled to the runs (``fit --prior``) and what its report shows."""

    scaling: PriorScaling
    calibration_toml: str
    written: str
    dropped: list[Dropped]
    warnings: list[str]


def fit_runs(request: FitRequest, on_left_out: Callable[[str], None] = lambda line: None) -> Fitted | Scaled:
    """Fit (or scale ``request.prior`` to) the runs of ``request.files``; nothing is written here.

    ``on_left_out`` hears one line per run the screen leaves out, as it is left out (before a too-few-runs
    error names "the reasons above").

    Raises
    ------
    InfeasibleError
        Fewer than :data:`sdplan.fitting.fit.MIN_FIT_RUNS` runs kept by the screen.
    InvalidValueError
        ``holdout_by="highest-load"`` with no configuration of three or more runs, or bad acceptance options.
    """
    runs, warnings = read_runs(request.files, result_alpha(request.files.acceptance))
    kept, dropped = screened(runs, on_left_out)
    results = request.files.results
    if request.prior is not None:  # scale a calibration to the runs instead of fitting one
        return _scaled(request, kept, dropped, warnings)
    out = request.output or Path("fitted.toml")
    paths = [silicon.resolve_path(split_file_facts(argument)[0]) for argument in results]
    kept, held = held_out(kept, request.holdout, request.holdout_by, request.seed)
    pooled, configurations = fit_pooled(kept), fit_configurations(kept)
    holdout_result = validate(pooled.coefficients_at, held) if held else None
    given = request.given.table()
    provenance = provenance_table(paths, given, f"{len(kept)} runs fitted, {len(dropped)} left out by the screen "
                                  "(sdplan-fit(1))" + (f", {len(held)} held out ({request.holdout_by})"
                                                       if held else ""))
    selection = silicon.Selection.parse(request.files.select)
    provenance.update(measured_provenance(paths, request.files.input_format, selection, given))
    holdout = (f"held-out {len(held)} runs ({request.holdout_by}): MAPE={holdout_result.mape_pct:.2f}%"
               if holdout_result else "")
    document = fitted_document(pooled, kept, name=request.name or (out.stem if request.output else "fitted"),
                               provenance=provenance, acceptance=acceptance_document(kept),
                               description=f"fitted from {len(results)} benchmark source(s) with sdplan fit",
                               holdout=holdout)
    try:
        parse_calibration(document, str(out))
    except NoLoadCostError as error:  # the runs' latency did not grow with their load: no saturation measured
        span = document["validity"]["batch_size"]
        raise InfeasibleError(
            f"{error.key}: the runs' latency did not grow with their load (batch sizes {span[0]}-{span[1]}), so the "
            "cost each request in flight adds is not measured and no saturation can be fitted; add runs at higher "
            "load, or scale a calibration to these runs with --prior CALIBRATION") from None
    return Fitted(document=document,
                  calibration_toml=dumps_toml(document, header="Fitted with 'sdplan fit' from benchmark results."),
                  written=str(out) if request.output else "-", pooled=pooled, configurations=configurations,
                  kept=kept, dropped=dropped, holdout=holdout_result, warnings=warnings)


def _scaled(request: FitRequest, kept: list[BenchmarkRun], dropped: list[Dropped], warnings: list[str]) -> Scaled:
    """``request.prior`` scaled to the kept runs (:func:`sdplan.metrics.prior.scale_prior`)."""
    out = request.output or Path("scaled.toml")
    paths = [silicon.resolve_path(split_file_facts(argument)[0]) for argument in request.files.results]
    provenance = provenance_table(paths, request.given.table(), "")
    assert request.prior is not None
    scaling = scale_prior(resolve_calibration(request.prior), kept, name=request.name or out.stem,
                          provenance=provenance, acceptance=acceptance_document(kept))
    return Scaled(scaling=scaling,
                  calibration_toml=dumps_toml(scaling.document,
                                              header="Scaled with 'sdplan fit --prior' to a server's runs."),
                  written=str(out) if request.output else "-", dropped=dropped, warnings=warnings)


def screened(runs: list[BenchmarkRun],
             on_left_out: Callable[[str], None]) -> tuple[list[BenchmarkRun], list[Dropped]]:
    """The runs the steady-state screen keeps, and those it leaves out with why (each told to ``on_left_out``).

    Too few kept runs is an error here, before any hold-out, so that the counts are the screen's.
    """
    kept: list[BenchmarkRun] = []
    dropped: list[Dropped] = []
    for run in runs:
        reasons = screen(run)
        if reasons:
            dropped.append((run, "; ".join(reasons)))
            on_left_out(f"left out {run.source}: {'; '.join(reasons)}")
        else:
            kept.append(run)
    if len(kept) < MIN_FIT_RUNS and dropped:
        raise InfeasibleError(f"only {len(kept)} of {len(runs)} runs usable, the other {len(dropped)} left out "
                              f"(reasons above); a fit needs at least {MIN_FIT_RUNS} (several loads per "
                              "configuration)")
    return kept, dropped


def held_out(kept: list[BenchmarkRun], holdout: float | None, holdout_by: str,
             seed: int) -> tuple[list[BenchmarkRun], list[BenchmarkRun]]:
    """The runs to fit and the runs held out (none unless ``holdout`` or ``holdout_by="highest-load"``)."""
    if not holdout and holdout_by != "highest-load":
        return kept, []
    fitted, held = holdout_split(kept, holdout_by, holdout or 0.0, seed)
    if not held:
        raise InvalidValueError("--holdout-by highest-load needs configurations with 3 or more runs")
    return fitted, held


def provenance_table(paths: list[Path], given: dict[str, str], notes: str) -> dict[str, Any]:
    """The fitted calibration's [provenance]: the options given, the sources with their digests, the counts."""
    return {"method": "fit", **given, "engine": "vllm", "date": datetime.date.today(),
            "created_by": f"sdplan fit (sdplan {__version__})",
            "sources": [f"{path.name} {file_digest(path)}" for path in paths], "notes": notes}


def measured_provenance(paths: list[Path], input_format: str, selection: silicon.Selection,
                        given: dict[str, str]) -> dict[str, Any]:
    """What AIConfigurator's rows say about themselves, for the keys the options (``given``) left at "unknown"."""
    measured = [(found, path) for path in paths
                if (found := silicon.configuration_in(path, input_format, selection)) is not None]
    if not measured:
        return {}
    taken: dict[str, Any] = {key: value for key, value in silicon.provenance(*measured[0]).items()
                             if given.get(key, "unknown").startswith("unknown")}
    if given["draft_model"].startswith("unknown"):
        taken["draft_model"] = "none (no SD rows)"
    return taken

