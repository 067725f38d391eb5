"""``sdplan fit --prior``: a calibration scaled to the runs (often a server's metrics) rather than fitted.

Also the fitted calibration's ``[provenance]`` table, which both ways of ``fit`` write.
"""

from __future__ import annotations

import datetime
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

if TYPE_CHECKING:
    from sdplan.metrics.prior import PriorScaling
    from sdplan.runs import BenchmarkRun


def provenance_table(paths: list[Path], given: dict[str, str], notes: str) -> dict[str, Any]:
    """The fitted calibration's [provenance]: the options given, the sources with their digests, the counts."""

    from sdplan import __version__
    from sdplan.runs import file_digest

    return {"method": "fit", **given, "engine": "vllm", "date": datetime.date.today(),
            "created_by": f"sdplan fit (sdplan {__version__})",
            "sources": [f"{path.name} {file_digest(path)}" for path in paths], "notes": notes}


def fit_to_prior(prior: str, results: tuple[str, ...], kept: list[BenchmarkRun],
                 dropped: list[tuple[BenchmarkRun, str]], warnings: list[str], given: dict[str, str],
                 name: str | None, calibration_out: str, fmt: str) -> None:
    """Scale ``prior`` to the kept runs (:func:`sdplan.metrics.prior.scale_prior`), write it, report the gap."""
    from sdplan.calibration import resolve_calibration
    from sdplan.fileio import atomic_write_text, dumps_toml
    from sdplan.metrics.acceptance import acceptance_document
    from sdplan.metrics.prior import scale_prior
    from sdplan.render import emit
    from sdplan.runs import silicon, split_file_facts

    to_stdout = calibration_out == "-"
    out = Path("scaled.toml" if to_stdout else calibration_out)
    paths = [silicon.resolve_path(split_file_facts(argument)[0]) for argument in results]
    provenance = provenance_table(paths, given, "")
    scaled = scale_prior(resolve_calibration(prior), kept, name=name or out.stem, provenance=provenance,
                         acceptance=acceptance_document(kept))
    text = dumps_toml(scaled.document, header="Scaled with 'sdplan fit --prior' to a server's runs.")
    report = render_scaling(scaled, "-" if to_stdout else str(out), dropped, warnings, fmt)
    if to_stdout:
        click.echo(text, nl=False)
        click.echo(report, err=True, nl=False)
        return
    atomic_write_text(out, text)
    emit(report, None)


def scaling_document(scaled: PriorScaling, written: str, dropped: list[tuple[BenchmarkRun, str]],
                     warnings: list[str]) -> dict[str, Any]:
    """The report as data (``--format json``)."""
    def gap(g: Any) -> dict[str, float]:
        return {"mape_pct": round(g.mape_pct, 3), "bias_pct": round(g.bias_pct, 3), "worst_pct": round(g.worst_pct, 3),
                "r2": round(g.r2, 4)}

    return {"command": "fit --prior", "calibration_written": written, "prior": scaled.prior_name,
            "c1_scale": scaled.c1_scale, "c2_scale": scaled.c2_scale, "one_factor": scaled.one_factor,
            "runs": scaled.runs, "measured_options": list(scaled.measured_options),
            "anchored": "every other option: scaled with the measured one, not measured",
            "gap_before": gap(scaled.before), "gap_after": gap(scaled.after),
            "runs_dropped": [{"source": run.source, "reason": why} for run, why in dropped], "warnings": warnings}


def render_scaling(scaled: PriorScaling, written: str, dropped: list[tuple[BenchmarkRun, str]], warnings: list[str],
                   fmt: str) -> str:
    """The report: the factors, the gap before and after, and what is anchored rather than measured."""

    document = scaling_document(scaled, written, dropped, warnings)
    if fmt == "json":
        return json.dumps(document, indent=1, allow_nan=False) + "\n"
    measured = ", ".join("no SD" if k == 0 else f"k={k}" for k in scaled.measured_options)
    before, after = scaled.before, scaled.after
    sides = (f"one factor x{scaled.c1_scale:.4g} on both C1 and C2 (the runs' loads could not tell them apart)"
             if scaled.one_factor else f"C1 side x{scaled.c1_scale:.4g}, C2 side x{scaled.c2_scale:.4g}")
    lines = [
        f"Answer: {scaled.prior_name} scaled to {scaled.runs} runs of {measured}: {sides}; wrote {written}.",
        f"Gap (mean E2E, {scaled.runs} runs): {before.mape_pct:.1f}% before (bias {before.bias_pct:+.1f}%, worst "
        f"{before.worst_pct:.1f}%), {after.mape_pct:.1f}% after (bias {after.bias_pct:+.1f}%, worst "
        f"{after.worst_pct:.1f}%).",
        f"Caveat: only {measured} was measured; every other option is anchored, not measured: its steps keep "
        f"{scaled.prior_name}'s ratios to the measured option's, scaled with it.",
    ]
    lines += [f"left out {run.source}: {why}" for run, why in dropped]
    lines += [f"warning: {text}" for text in warnings]
    return "\n".join(lines) + "\n"
