"""Views of calibrations: the shipped listing and one calibration in detail."""

from __future__ import annotations

import datetime as _dt
import re
from dataclasses import asdict
from typing import TYPE_CHECKING, Any

from rich.markup import escape
from rich.table import Table
from rich.text import Text

from sdplan import __version__
from sdplan.render import (
    JSON_SCHEMA_VERSION,
    OutputFormat,
    Style,
    print_table,
    render_rich,
    table_box,
    to_json,
)
from sdplan.render.plan import METHOD_LABELS
from sdplan.units import finite_or_none

if TYPE_CHECKING:
    from sdplan.calibration import Calibration
    from sdplan.calibration.views import CalibrationShown, ShippedListing


def _plain(value: Any) -> Any:
    """TOML values as JSON values (dates become ISO strings)."""
    if isinstance(value, (_dt.date, _dt.datetime)):
        return value.isoformat()
    if isinstance(value, dict):
        return {key: _plain(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_plain(item) for item in value]
    return value


def render_listing(listing: ShippedListing, fmt: OutputFormat, style: Style, terminal: bool) -> str:
    """The shipped calibrations (:func:`sdplan.calibration.views.list_shipped`), the default marked."""
    entries = [(entry.path, entry.calibration, entry.error) for entry in listing.entries]
    default_name = listing.default_name
    if fmt is OutputFormat.JSON:
        items = []
        for path, cal, error in entries:
            item: dict[str, Any] = {"path": path, "valid": cal is not None, "default": False}
            if cal is not None:
                item.update(
                    name=cal.name,
                    default=cal.name == default_name,
                    description=cal.document.get("description"),
                    form=cal.form,
                    reference_workload=_plain(cal.document["reference_workload"]),
                    provenance=_plain(cal.provenance),
                    fit_quality=_plain(cal.document.get("fit_quality")),
                    origin=cal.origin(),
                )
            else:
                item["error"] = error
            items.append(item)
        return to_json({"schema_version": JSON_SCHEMA_VERSION, "sdplan_version": __version__,
                        "command": "calibrations", "calibrations": items})

    def draw(console: Any) -> None:
        table = Table(box=table_box(style))
        table.add_column("name; hardware: target + draft")
        table.add_column("method")
        for path, cal, error in entries:
            if cal is None:
                table.add_row(Text(f"{path}\n  {error or ''}"), "INVALID")
                continue
            prov = cal.provenance
            quality = cal.document.get("fit_quality", {}).get("r2")
            origin = cal.origin()
            table.add_row(
                Text(cal.name + ("*" if cal.name == default_name else "")
                     + f"\n  {prov['hardware']}: {prov['target_model']} + {prov['draft_model']}"
                     + f"\n  measured: {origin['measured']}\n  derived: {origin['derived']}"
                     + f"\n  assumed: {len(origin['assumed'])} assumptions (sdplan show)"
                     + f"\n  versions: {'; '.join(origin['versions'])}"),
                Text(f"{cal.method}\n{_plain(prov['date'])}" + ("" if quality is None else f"\nR2 {quality:.4f}")),
            )
        print_table(console, table, title="Shipped calibrations",
                    caption="* default (used when -c is not given). Method 'roofline' = derived from datasheets, "
                    "not measured; 'derived' = priced by AIConfigurator's silicon op database. Details: sdplan show "
                    "NAME.")

    return render_rich(draw, style, terminal)


def _short_digests(text: str) -> str:
    """``sha256:`` digests cut to their first 12 hex digits, as git shortens commits: a whole digest is a
    71-character word, wider than a table's value column at 80 columns (the file and JSON keep it whole)."""
    return re.sub(r"(sha256:[0-9a-f]{12})[0-9a-f]+", r"\1", text)


def render_calibration(shown: CalibrationShown, fmt: OutputFormat, style: Style, terminal: bool) -> str:
    """One calibration: provenance, forms, and the coefficients at a workload
    (:func:`sdplan.calibration.views.show_calibration`)."""
    cal, coefficients = shown.calibration, shown.coefficients
    c1_d, c2_d = shown.baseline_demand
    derived = asdict(coefficients)
    if fmt is OutputFormat.JSON:
        return to_json({
            "schema_version": JSON_SCHEMA_VERSION,
            "sdplan_version": __version__,
            "command": "show",
            "path": cal.path,
            "valid": True,
            "form": cal.form,
            "document": _plain(cal.document),
            "origin": cal.origin(),
            "coefficients_at_workload": derived,
            "baseline": {"c1_s": c1_d, "c2_s": c2_d,
                         "saturation_rate_rps": finite_or_none(1.0 / c2_d if c2_d > 0 else float("inf"))},
            "step_times_at_workload": {
                "definition": STEP_TIMES_NOTE,
                "batch_requests": list(shown.step_batches),
                **({"drafting_definition": DRAFTING_NOTE} if shown.step_drafting_s else {}),
                "options": [{"draft_length_tokens": k, "step_s": [row[j] for row in shown.step_times_s],
                             **({"drafting_s": [row[j] for row in shown.step_drafting_s]}
                                if k and shown.step_drafting_s else {}),
                             **({"engine_overhead_s": [row[j] for row in shown.step_overhead_s]}
                                if shown.step_overhead_s else {})}
                            for j, k in enumerate(shown.step_draft_lengths)]},
            "max_num_seqs": {"requests": shown.max_num_seqs[0], "source": shown.max_num_seqs[1]},
            "batch_caps_at_workload": [{"draft_length_tokens": k, "requests": cap, "limit": phrase}
                                       for k, cap, phrase in shown.batch_caps],
            "kv_cache_rule": shown.kv_rule,
        })

    def draw(console: Any) -> None:
        console.print(f"[bold]{escape(cal.name)}[/bold]  ({escape(str(cal.path))}): valid, schema version "
                      f"{cal.document['schema_version']}")
        if "description" in cal.document:
            console.print(Text(str(cal.document["description"])))
        console.print(f"method: {cal.method} ({METHOD_LABELS.get(cal.method, cal.method)}); form: {cal.form}")
        prov = Table(box=table_box(style), show_header=False)
        prov.add_column("key")
        prov.add_column("value")
        for key, value in cal.provenance.items():
            if isinstance(value, list):
                value = "\n".join(f"- {item}" for item in value)
            prov.add_row(key, Text(_short_digests(str(_plain(value)))))
        ref = cal.document["reference_workload"]
        prov.add_row("reference workload",
                     f"{ref['prompt_tokens']} prompt tokens, {ref['output_tokens']} output tokens")
        for key, span in cal.document.get("validity", {}).items():
            prov.add_row(f"valid {key.replace('_', ' ')}", f"{span[0]:g} .. {span[1]:g}")
        for key, value in cal.document.get("fit_quality", {}).items():
            prov.add_row(f"fit {key}", str(value))
        acceptance = cal.document.get("acceptance")
        if acceptance:
            prov.add_row("acceptance", f"per-token alpha {acceptance['per_token_alpha']:.4f} ({acceptance['source']})")
            if acceptance.get("per_position_rates"):
                prov.add_row("acceptance per position", "conditional a_i " + ", ".join(
                    f"{rate:.3g}" for rate in acceptance["per_position_rates"]) + " (the planner's E(k) up to "
                    f"k={len(acceptance['per_position_rates'])})")
        print_table(console, prov, title="Provenance")
        print_table(console, origin_table(cal, style), title="Measured, derived, assumed")

        coeffs = Table(box=table_box(style))
        for header in ("coefficient", "value", "meaning"):
            coeffs.add_column(header)
        meanings = {
            "c1p_s": "prefill, s per request",
            "c2p_s": "prefill, s per request per concurrent request",
            "c1v_s": "SD verification, s per cycle",
            "c2v_s": "SD verification, s per cycle per concurrent request",
            "c1d_s": "drafting, s per draft token",
            "c2d_s": "drafting, s per draft token per concurrent request",
            "baseline_c1_step_s": "no-SD decode step, s per step",
            "baseline_c2_step_s": "no-SD decode step, s per step per concurrent request",
        }
        for key, meaning in meanings.items():
            coeffs.add_row(key, f"{derived[key]:.6g}", meaning)
        if coefficients.frontend_chunk_s > 0:
            coeffs.add_row("frontend_chunk_s", f"{coefficients.frontend_chunk_s:.6g}",
                           "serving frontend, s per streamed chunk: C2 at least chunks x this")
        if coefficients.knee_per_token_s > 0:
            coeffs.add_row("knee_tokens", f"{coefficients.knee_tokens:.6g}",
                           "token rows per step past which the target is compute-bound")
            coeffs.add_row("knee_per_token_s", f"{coefficients.knee_per_token_s:.6g}",
                           "s each token row past the knee adds to a step")
        if coefficients.load_concavity_sqrt_requests > 0:
            coeffs.add_row("load_concavity_sqrt_requests", f"{coefficients.load_concavity_sqrt_requests:.6g}",
                           "psi: B others in flight cost C2 (B + psi sqrt(B)); the first cost more each")
        steps = cal.document.get("step_model", {})
        engine = steps.get("engine", {})
        if "step_overhead_s" in engine:
            coeffs.add_row("step_overhead_s", f"{engine['step_overhead_s']:.6g}",
                           "engine host time, s per step, SD or not")
        if "prefill_overhead_s" in engine:
            coeffs.add_row("prefill_overhead_s", f"{engine['prefill_overhead_s']:.6g}",
                           "server time around a request's prefill, s (TTFT)")
        if "speculation" in steps:
            coeffs.add_row("overhead_fixed_s", f"{steps['speculation']['overhead_fixed_s']:.6g}",
                           "SD cycle's own overhead, s per cycle")
        coeffs.add_row("C1_D", f"{c1_d:.6g}", "no SD: zero-load latency, s")
        coeffs.add_row("C2_D", f"{c2_d:.6g}", "no SD: s per concurrent request" + (
            " past the knee" if coefficients.knee_per_token_s > 0 else
            " at many in flight" if coefficients.load_concavity_sqrt_requests > 0 else ""))
        coeffs.add_row("1/C2_D", f"{1.0 / c2_d:.6g}" if c2_d > 0 else "inf", "no SD: saturation rate, req/s")
        print_table(console, coeffs,
                    title=f"Coefficients at {coefficients.prompt_tokens:g} prompt / {coefficients.output_tokens:g} "
                    "output tokens")
        if shown.step_times_s:
            valid = cal.document.get("validity", {}).get("batch_size")
            beyond = (f"; past B = {valid[1]:g} (its valid batch sizes) the curve is extrapolated"
                      if valid and valid[1] < max(shown.step_batches) else "")
            print_table(console, step_table(shown, style),
                        title=f"Engine step at {coefficients.prompt_tokens:g} prompt / {coefficients.output_tokens:g} "
                        "output tokens (ms)", caption=STEP_TIMES_NOTE + beyond + overhead_phrase(shown))
        if shown.batch_caps:
            print_table(console, cap_table(shown, style),
                        title=f"Requests each engine keeps running at {coefficients.prompt_tokens:g} prompt / "
                        f"{coefficients.output_tokens:g} output tokens",
                        caption=f"max_num_seqs {shown.max_num_seqs[0]} ({shown.max_num_seqs[1]}); "
                                + CAPS_NOTE.format(rule=shown.kv_rule))

    return render_rich(draw, style, terminal)


#: What the step table of ``sdplan show`` holds.
STEP_TIMES_NOTE = ("one engine step with B sequences in flight at the workload's mean context: a decode step without "
                   "SD; with SD a cycle (drafting k tokens, then verifying k + 1 a sequence, the engine's overheads "
                   "included), which emits E tokens a sequence; no concurrent prefill")


#: What the JSON's ``drafting_s`` of an SD option holds.
DRAFTING_NOTE = ("drafting_s: of an SD cycle's step_s, the drafter's k steps as priced (the draft model's or head's "
                 "device work; an n-gram lookup is host time, in engine_overhead_s where given); the rest is the "
                 "verification pass of k + 1 tokens a sequence and the engine's overheads. Given for a file with a "
                 "step model; a fitted file prices a drafted token and its verified row as one cost")


#: What the batch-cap table of ``sdplan show`` holds.
CAPS_NOTE = ("the smaller of max_num_seqs and the requests of the workload its KV cache keeps running (a draft's "
             "weights and KV take cache; {rule}); past it requests wait for admission. --max-num-seqs, "
             "--kv-cache-tokens or a workload file's deployment.max_batch_size set them in plan, check, capacity and "
             "simulate")


def cap_table(shown: CalibrationShown, style: Style) -> Any:
    """A row per run of options with the same cap (``k=1-4``): requests held at once and what limits them."""
    table = Table(box=table_box(style))
    for header in ("option", "requests", "limit"):
        table.add_column(header, justify="right" if header == "requests" else "left")
    runs: list[list[Any]] = []
    for k, cap, phrase in shown.batch_caps:
        if runs and k and runs[-1][0] and (runs[-1][2], runs[-1][3]) == (cap, phrase):
            runs[-1][1] = k
        else:
            runs.append([k, k, cap, phrase])
    for first, last, cap, phrase in runs:
        name = "no SD" if first == 0 else f"k={first}" if first == last else f"k={first}-{last}"
        table.add_row(name, str(cap), phrase.split(": ", 1)[-1])
    return table


def overhead_phrase(shown: CalibrationShown) -> str:
    """What of the step table is the engine's overheads beside the op timings, for a file that prices them."""
    if not shown.step_overhead_s or not any(any(row) for row in shown.step_overhead_s):
        return ""
    first = shown.step_overhead_s[0]
    phrase = f"; of each step {1e3 * first[0]:.3g} ms is the engine's overhead beside its kernels"
    if len(first) > 1:
        grows = len({row[1] for row in shown.step_overhead_s}) > 1
        phrase += f", of an SD cycle {1e3 * first[1]:.3g} ms" + (f" at B = {shown.step_batches[0]}, more with B"
                                                                  if grows else "")
    return phrase + ": take it off to hold a row against kernel timings (JSON engine_overhead_s)"


def step_table(shown: CalibrationShown, style: Style) -> Any:
    """Rows of batch sizes, a column per option: the step :func:`sdplan.latency.model.step_times` prices."""
    table = Table(box=table_box(style))
    table.add_column("B (sequences)", justify="right")
    for k in shown.step_draft_lengths:
        table.add_column("no SD" if k == 0 else f"k={k}", justify="right")
    for batch, row in zip(shown.step_batches, shown.step_times_s):
        table.add_row(str(batch), *(f"{1e3 * t:.3g}" for t in row))
    return table


def anchor_summary(derivation: dict[str, Any]) -> str:
    """The anchor's TPOT gap before and after, from the ``anchor_*`` keys the file gives (each optional)."""

    def given(key: str, form: str) -> str | None:
        return form.format(derivation[key]) if key in derivation else None

    before = [part for part in (given("anchor_gap_mape_pct", "MAPE {:.1f}%"),
                                given("anchor_gap_bias_pct", "bias {:+.1f}%")) if part]
    after = [part for part in (given("anchor_anchored_mape_pct", "MAPE {:.1f}%"),
                               given("anchor_decode_scale", "decode x{:.3f}"),
                               given("anchor_prefill_scale", "prefill x{:.3f}")) if part]
    text = f"over {derivation['anchor_rows']} rows"
    if before:
        text = f"TPOT gap before anchoring: {', '.join(before)} {text}"
    return text + (f"; after: {', '.join(after)}" if after else "")


def origin_table(cal: Calibration, style: Style) -> Any:
    """What the file measured, derived and assumed, with versions (:meth:`Calibration.origin`)."""
    origin = cal.origin()
    table = Table(box=table_box(style), show_header=False)
    table.add_column("what")
    table.add_column("detail")
    # The file's own words: text, never rich markup ("[derivation] anchor" is a TOML table's name).
    table.add_row("measured", Text(origin["measured"]))
    table.add_row("derived", Text(origin["derived"]))
    table.add_row("assumed", Text("\n".join(f"- {item}" for item in origin["assumed"]) or "nothing"))
    table.add_row("versions", Text("\n".join(origin["versions"])))
    derivation = cal.document.get("derivation")
    if derivation:
        for component in ("target", "draft", "prefill", "interference"):
            # each error is optional on its own (the draft's are): show what the file gives
            errors = [f"{stat} {derivation[key]:.1f}%" for stat in ("mean", "max")
                      if (key := f"{component}_{stat}_error_pct") in derivation]
            if errors:
                table.add_row(f"{component} step form", ", ".join(errors) + " from the priced curve")
        table.add_row("anchor", Text(str(derivation["anchor"])))
        if "anchor_rows" in derivation:
            table.add_row("measured vs derived", anchor_summary(derivation))
    return table


def render_derivation(cal: Calibration, fmt: OutputFormat, style: Style, terminal: bool) -> str:
    """The report of ``sdplan derive``: the file written and what in it was measured, derived and assumed."""
    if fmt is OutputFormat.JSON:
        return to_json({"schema_version": JSON_SCHEMA_VERSION, "sdplan_version": __version__, "command": "derive",
                        "path": cal.path, "name": cal.name, "origin": cal.origin(),
                        "derivation": _plain(cal.document["derivation"]),
                        "step_model": _plain(cal.document["step_model"])})

    def draw(console: Any) -> None:
        console.print(f"[bold]{escape(cal.name)}[/bold] -> {escape(str(cal.path))}")
        print_table(console, origin_table(cal, style), title="Measured, derived, assumed")

    return render_rich(draw, style, terminal)
