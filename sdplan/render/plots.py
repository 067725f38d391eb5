"""Pictures: terminal plots (plotext) and figure files (matplotlib, the optional ``plot`` extra).

The three panels of a plan are the pictures this field reasons with: mean
latency against request rate for no SD and each draft length (with the
saturation asymptotes), the speedup of each draft length against rate (with
the break-even line at 1), and the best draft length against rate as a step
line. Capacity gets the highest rate under the SLOs per option, validation
measured against predicted latency with the error band.
"""

from __future__ import annotations

import io
import math
import textwrap
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from sdplan.errors import InvalidValueError, MissingDependencyError
from sdplan.fileio import atomic_write_bytes
from sdplan.planning.planner import NONE_STABLE
from sdplan.render.answer import acceptance_origin

if TYPE_CHECKING:
    from sdplan.planning.planner import Plan, PlanInputs

PLOT_HINT = "figure files need matplotlib: pip install matplotlib (in an sdplan checkout: pip install -e '.[plot]')"
FILE_FORMATS = (".png", ".svg")
#: Latency axes stop at this multiple of the largest zero-load latency (curves go to infinity at saturation).
LATENCY_CLIP = 6.0
MAX_ACCEPTANCE_ROWS = 4


#: Draw at most this many draft lengths per panel (the best ones plus the ends of the range).
MAX_K_SERIES = 8


def _plot_k(plan: Plan, ia: int) -> list[int]:
    """Indices of the k curves to draw: all if few, else the best ones plus the ends."""
    count = len(plan.draft_lengths)
    if count <= MAX_K_SERIES:
        return list(range(count))
    wanted = {0, count - 1}
    for k in plan.best_k[ia]:
        if k > 0:
            wanted.add(int(list(plan.draft_lengths).index(k)))
    for ik in sorted(range(count), key=lambda ik: float(plan.c1_s[ia, ik])):
        if len(wanted) >= MAX_K_SERIES:
            break
        wanted.add(ik)
    return sorted(wanted)[:MAX_K_SERIES]


def _finite(values: Any, clip: float) -> list[float | None]:
    return [float(v) if math.isfinite(v) and v <= clip else None for v in values]


def _segments(xs: Any, ys: list[float | None]) -> list[tuple[list[float], list[float]]]:
    """Split a curve where it leaves the plot (unstable or clipped)."""
    parts: list[tuple[list[float], list[float]]] = []
    current: tuple[list[float], list[float]] = ([], [])
    for x, y in zip(xs, ys):
        if y is None:
            if current[0]:
                parts.append(current)
            current = ([], [])
        else:
            current[0].append(float(x))
            current[1].append(y)
    if current[0]:
        parts.append(current)
    return parts


#: Marker characters per series, so curves stay distinguishable without colour.
MARKERS = ("*", "+", "x", "o", "#", "@", "%", "=", "~")


def _step(xs: list[float], ys: list[float]) -> tuple[list[float], list[float]]:
    """A step line through (x, y) points: each value holds until midway to the next x."""
    step_x, step_y = [xs[0]], [ys[0]]
    for (x0, y0), (x1, y1) in zip(zip(xs, ys), zip(xs[1:], ys[1:])):
        middle = 0.5 * (x0 + x1)
        step_x += [middle, middle]
        step_y += [y0, y1]
    step_x.append(xs[-1])
    step_y.append(ys[-1])
    return step_x, step_y


def _start(plt: Any, width: int, height: int, color: bool) -> None:
    plt.clear_figure()
    plt.plotsize(width, height)
    if not color:
        plt.theme("clear")


_PENDING_TITLE: list[str] = []


def _title(plt: Any, title: str, width: int) -> None:
    """Set the panel title; one too long for plotext (which would drop it) is printed above, wrapped."""
    _PENDING_TITLE.clear()
    if len(title) <= width - 6:
        plt.title(title)
    else:
        _PENDING_TITLE.extend(textwrap.wrap(title, width=width))


def _finish(plt: Any, color: bool) -> str:
    text = plt.build()
    text = text if color else plt.uncolorize(text)
    if _PENDING_TITLE:
        text = "\n".join(_PENDING_TITLE) + "\n" + text
        _PENDING_TITLE.clear()
    return text


def _label(plan: Plan, ia: int, inputs: PlanInputs | None = None) -> str:
    """``alpha 0.70 assumed``: the acceptance of a panel and where it came from (said in every figure)."""
    alpha = plan.alphas[ia]
    origin = acceptance_origin(inputs.acceptance.source) if inputs is not None else "given"
    return f"alpha {alpha:.2f} {origin}"


# ----------------------------------------------------------------------------- terminal


def _legend(entries: list[str], width: int) -> str:
    """The legend as text lines under a panel, wrapped at ``width``."""
    return "\n".join(textwrap.wrap("legend: " + ", ".join(entries), width=width, subsequent_indent="  "))


def terminal_plan(plan: Plan, inputs: PlanInputs, width: int, color: bool) -> str:
    """Three plotext panels per acceptance value, as text."""
    import plotext as plt

    blocks = []
    rates = list(map(float, plan.rates_rps))
    for ia in range(min(len(plan.alphas), MAX_ACCEPTANCE_ROWS)):
        ks = _plot_k(plan, ia)
        clip = LATENCY_CLIP * max(plan.baseline_c1_s, float(plan.c1_s[ia].max()))
        series = [("no SD", plan.baseline_latency_s)] + [(f"k={plan.draft_lengths[ik]}", plan.latency_s[ia, :, ik])
                                                        for ik in ks]
        _start(plt, width, 20, color)
        # legends are printed under each panel: plotext draws its legend over the curves
        legend = []
        for index, (name, values) in enumerate(series):
            legend.append(f"{MARKERS[index % len(MARKERS)]} {name}")
            for x, y in _segments(rates, _finite(values, clip)):
                plt.plot(x, y, marker=MARKERS[index % len(MARKERS)])
        if math.isfinite(plan.baseline_saturation_rate_rps) and plan.baseline_saturation_rate_rps <= rates[-1] * 1.2:
            plt.vline(plan.baseline_saturation_rate_rps)
        _title(plt, f"mean E2E latency (s) vs request rate, {_label(plan, ia, inputs)}; | no-SD saturation", width)
        plt.xlabel("request rate (req/s)")
        latency_panel = _finish(plt, color) + "\n" + _legend(legend + ["| no-SD saturation"], width)

        _start(plt, width, 16, color)
        top = 3.0 * float(max(plan.baseline_c1_s / plan.c1_s[ia].min(), 1.0))
        # the 1x line as a curve, mapped to rows exactly like the data (plotext's hline rounds differently;
        # drawn first so that the curves stay on top of it)
        plt.plot([rates[0], rates[-1]], [1.0, 1.0], marker="-")
        legend = []
        for index, ik in enumerate(ks, start=1):
            speed = [float(v) if math.isfinite(v) and 0 < v <= top else None for v in plan.speedup[ia, :, ik]]
            legend.append(f"{MARKERS[index % len(MARKERS)]} k={plan.draft_lengths[ik]}")
            for x, y in _segments(rates, speed):
                plt.plot(x, y, marker=MARKERS[index % len(MARKERS)])
        _title(plt, f"speedup over no SD (x) vs request rate, {_label(plan, ia, inputs)}; - break-even (1x)", width)
        plt.xlabel("request rate (req/s)")
        speedup_panel = _finish(plt, color) + "\n" + _legend(legend + ["- break-even (1x)"], width)

        _start(plt, width, 12, color)
        best = [float(k) if k != NONE_STABLE else None for k in plan.best_k[ia]]
        for x, y in _segments(rates, best):
            plt.plot(*_step(x, y), marker="*")
        _title(plt, f"best draft length vs request rate, {_label(plan, ia, inputs)}", width)
        plt.xlabel("request rate (req/s)")
        best_panel = _finish(plt, color) + "\n" + _legend(["* best k (0 = SD off)"], width)
        blocks.append("\n".join((latency_panel, speedup_panel, best_panel)))
    return "\n".join(blocks) + "\n"


def terminal_bars(labels: list[str], values: list[float], title: str, xlabel: str, width: int, color: bool) -> str:
    import plotext as plt

    _start(plt, width, max(8, 2 * len(labels) + 6), color)
    plt.bar(labels, values, orientation="horizontal", width=0.5)
    _title(plt, title, width)
    plt.xlabel(xlabel)
    return _finish(plt, color) + "\n"


def terminal_scatter(measured: list[float], predicted: list[float], title: str, width: int, color: bool) -> str:
    import plotext as plt

    _start(plt, width, 22, color)
    top = max(measured + predicted) * 1.05
    plt.plot([0, top], [0, top], label="predicted = measured", marker=".")
    plt.plot([0, top], [0, top * 1.1], label="+10%", marker="-")
    plt.plot([0, top], [0, top * 0.9], label="-10%", marker="-")
    plt.scatter(measured, predicted, label="runs", marker="x")
    _title(plt, title, width)
    plt.xlabel("measured mean E2E latency (s); y: predicted (s)")
    return _finish(plt, color) + "\n"


# ----------------------------------------------------------------------------- files


def _pyplot() -> Any:
    try:
        import matplotlib
    except ImportError:
        raise MissingDependencyError(PLOT_HINT) from None
    matplotlib.use("Agg")
    matplotlib.rcParams["svg.fonttype"] = "none"  # keep text as text in SVG (searchable, testable)
    import matplotlib.pyplot as pyplot

    return pyplot


def check_plot_path(path: str) -> Path:
    target = Path(path)
    if target.suffix.lower() not in FILE_FORMATS:
        raise InvalidValueError(f"--plot-file {path}: use a .png or .svg file name")
    return target


def _save(figure: Any, path: Path) -> None:
    buffer = io.BytesIO()
    figure.savefig(buffer, format=path.suffix.lower()[1:], dpi=150, bbox_inches="tight")
    atomic_write_bytes(path, buffer.getvalue())


def file_plan(plan: Plan, inputs: PlanInputs, path: Path) -> None:
    """Latency, speedup and best-k panels (one row per acceptance value) to PNG or SVG."""
    pyplot = _pyplot()
    rows = min(len(plan.alphas), MAX_ACCEPTANCE_ROWS)
    figure, axes = pyplot.subplots(rows, 3, figsize=(16, 4.6 * rows), squeeze=False)
    rates = plan.rates_rps
    colours = pyplot.rcParams["axes.prop_cycle"].by_key()["color"]
    for ia in range(rows):
        ks = _plot_k(plan, ia)
        clip = LATENCY_CLIP * max(plan.baseline_c1_s, float(plan.c1_s[ia].max()))
        latency_axis, speed_axis, best_axis = axes[ia]
        latency_axis.plot(rates, [v if v is not None else math.nan for v in _finite(plan.baseline_latency_s, clip)],
                          color="black", linewidth=2, label="no SD")
        if math.isfinite(plan.baseline_saturation_rate_rps):
            latency_axis.axvline(plan.baseline_saturation_rate_rps, color="black", linestyle=":", linewidth=1)
        for index, ik in enumerate(ks):
            colour = colours[index % len(colours)]
            k = plan.draft_lengths[ik]
            latency_axis.plot(rates,
                              [v if v is not None else math.nan for v in _finite(plan.latency_s[ia, :, ik], clip)],
                              color=colour, label=f"k={k}")
            saturation = float(plan.saturation_rate_rps[ia, ik])
            if math.isfinite(saturation) and saturation <= rates[-1] * 1.1:
                latency_axis.axvline(saturation, color=colour, linestyle=":", linewidth=1)
            speed = [v if math.isfinite(v) and v > 0 else math.nan for v in plan.speedup[ia, :, ik]]
            speed_axis.plot(rates, speed, color=colour, label=f"k={k}")
            even = float(plan.break_even_rate_rps[ia, ik])
            if math.isfinite(even):
                speed_axis.plot([even], [1.0], marker="o", color=colour)
        speed_axis.axhline(1.0, color="black", linestyle="--", linewidth=1, label="break-even (1x)")
        top = 3.0 * float(max(plan.baseline_c1_s / plan.c1_s[ia].min(), 1.0))  # near saturation speedups explode
        speed_axis.set_ylim(0, top)
        best = [float(k) if k != NONE_STABLE else math.nan for k in plan.best_k[ia]]
        best_axis.step(rates, best, where="mid", color="tab:blue", linewidth=2)
        best_axis.set_yticks(sorted({0, *[int(plan.draft_lengths[i]) for i in ks]}))
        best_axis.set_yticklabels(["off" if t == 0 else str(t) for t in best_axis.get_yticks().astype(int)])
        label = _label(plan, ia, inputs)
        latency_axis.set(xlabel="request rate (req/s)", ylabel="mean E2E latency (s)",
                         title=f"Latency vs load ({label}); dotted: saturation")
        speed_axis.set(xlabel="request rate (req/s)", ylabel="speedup over no SD (x)",
                       title=f"Speedup vs load ({label}); dots: break-even")
        best_axis.set(xlabel="request rate (req/s)", ylabel="best draft length k",
                      title=f"Best k vs load ({label})")
        latency_axis.set_ylim(bottom=0)
        for axis in (latency_axis, speed_axis, best_axis):
            axis.grid(alpha=0.3)
            axis.set_xlim(left=0)
        latency_axis.legend(fontsize=8, ncol=2)
        speed_axis.legend(fontsize=8, ncol=2)
    provenance = inputs.calibration_provenance
    figure.suptitle(f"{inputs.calibration_name} ({inputs.calibration_method}): {provenance.get('target_model')} + "
                    f"{provenance.get('draft_model')} on {provenance.get('hardware')}\n"
                    f"{inputs.prompt_tokens} prompt / {inputs.output_tokens} output tokens; "
                    f"acceptance {inputs.acceptance_description}", fontsize=10)
    figure.tight_layout()
    _save(figure, path)
    pyplot.close(figure)


def file_bars(labels: list[str], values: list[float], title: str, xlabel: str, path: Path,
              highlight: str | None = None) -> None:
    pyplot = _pyplot()
    figure, axis = pyplot.subplots(figsize=(8, 0.45 * len(labels) + 1.8))
    colours = ["tab:green" if label == highlight else "tab:blue" for label in labels]
    axis.barh(labels, values, color=colours)
    axis.invert_yaxis()
    axis.set(xlabel=xlabel, title=title)
    axis.grid(axis="x", alpha=0.3)
    figure.tight_layout()
    _save(figure, path)
    pyplot.close(figure)


def file_scatter(measured: list[float], predicted: list[float], labels: list[str], title: str, path: Path) -> None:
    pyplot = _pyplot()
    figure, axis = pyplot.subplots(figsize=(6.5, 6))
    top = max(measured + predicted) * 1.05
    axis.fill_between([0, top], [0, top * 0.9], [0, top * 1.1], color="tab:green", alpha=0.15, label="+/-10%")
    axis.plot([0, top], [0, top], color="black", linewidth=1, label="predicted = measured")
    for group in sorted(set(labels)):
        xs = [m for m, g in zip(measured, labels) if g == group]
        ys = [p for p, g in zip(predicted, labels) if g == group]
        axis.scatter(xs, ys, label=group, s=18)
    axis.set(xlim=(0, top), ylim=(0, top), xlabel="measured mean E2E latency (s)",
             ylabel="predicted mean E2E latency (s)", title=title)
    axis.grid(alpha=0.3)
    axis.legend(fontsize=8)
    figure.tight_layout()
    _save(figure, path)
    pyplot.close(figure)


def _cdf_points(values: Any, points: int = 200) -> tuple[list[float], list[float]]:
    ordered = np.sort(np.asarray(values, dtype=np.float64))
    index = np.linspace(0, ordered.size - 1, min(points, ordered.size)).astype(int)
    return list(map(float, ordered[index])), list(map(float, (index + 1) / ordered.size))


def terminal_cdf(series: list[tuple[str, Any]], title: str, width: int, color: bool) -> str:
    import plotext as plt

    _start(plt, width, 20, color)
    for index, (name, values) in enumerate(series):
        x, y = _cdf_points(values)
        plt.plot(x, y, label=name, marker=MARKERS[index % len(MARKERS)])
    _title(plt, title, width)
    plt.xlabel("E2E latency (s); y: fraction of requests")
    return _finish(plt, color) + "\n"


def file_cdf(series: list[tuple[str, Any]], title: str, path: Path) -> None:
    pyplot = _pyplot()
    figure, axis = pyplot.subplots(figsize=(7.5, 5))
    for name, values in series:
        x, y = _cdf_points(values, 1000)
        axis.plot(x, y, label=name)
    for level in (0.5, 0.9, 0.99):
        axis.axhline(level, color="grey", linestyle=":", linewidth=0.8)
    axis.set(xlabel="E2E latency (s)", ylabel="fraction of requests", title=title, ylim=(0, 1.01))
    axis.grid(alpha=0.3)
    axis.legend(fontsize=8)
    figure.tight_layout()
    _save(figure, path)
    pyplot.close(figure)
