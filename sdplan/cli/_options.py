"""Shared click options and value parsers (no numpy here: help must stay light)."""

from __future__ import annotations

import math
import os
import shutil
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import click
from click.shell_completion import CompletionItem

from sdplan.errors import ExitStatus
from sdplan.limits import MAX_DRAFT_LENGTH, MAX_TOKENS

#: Largest number of values one list option may expand to.
MAX_LIST_VALUES = 100_000

FuncT = Callable[..., Any]


@dataclass(frozen=True, slots=True, kw_only=True)
class OutputRequest:
    """Where and how a command writes its answer: ``output_options`` and ``plot_options`` as click parsed them."""

    fmt: str
    output: str | None
    ascii_only: bool
    plot: bool = False
    plot_file: str | None = None


def apply_options(fn: FuncT, decorators: Sequence[Callable[[FuncT], FuncT]]) -> FuncT:
    for decorator in reversed(decorators):
        fn = decorator(fn)
    return fn


def parse_number(text: str, what: str) -> float:
    """A finite float; ``62%`` means 0.62."""
    raw = text.strip()
    scale = 1.0
    if raw.endswith("%"):
        raw, scale = raw[:-1], 0.01
    try:
        value = float(raw) * scale
    except ValueError:
        raise click.BadParameter(f"'{text}' is not a number ({what})") from None
    if not math.isfinite(value):
        raise click.BadParameter(f"'{text}' is not finite ({what})")
    return value


def parse_number_list(text: str, what: str) -> list[float]:
    """Parse ``1,2,4`` and inclusive ranges ``start:stop:step`` (mixable: ``0.5:4:0.5,8``)."""
    values: list[float] = []
    for item in text.split(","):
        item = item.strip()
        if not item:
            raise click.BadParameter(f"empty item in '{text}'; write e.g. 1,2,4 or 0.5:16:0.5")
        parts = item.split(":")
        if len(parts) == 1:
            values.append(parse_number(item, what))
            continue
        if len(parts) != 3:
            raise click.BadParameter(f"'{item}' is not START:STOP:STEP ({what})")
        start, stop, step = (parse_number(part, what) for part in parts)
        if step <= 0 or stop < start:
            raise click.BadParameter(f"'{item}' needs STEP > 0 and STOP >= START ({what})")
        span = (stop - start) / step
        if not math.isfinite(span) or span + 1 + len(values) > MAX_LIST_VALUES:
            shown = f"{span + 1:.3g}" if math.isfinite(span) else "too many"
            raise click.BadParameter(f"'{item}' expands to {shown} values; at most {MAX_LIST_VALUES} are allowed "
                                     f"in all; use a larger STEP ({what})")
        count = math.floor(span + 1e-9) + 1
        values.extend(round(start + i * step, 12) for i in range(count))
    return values


def parse_int_list(text: str, what: str, maximum: int = MAX_DRAFT_LENGTH) -> list[int]:
    """Parse ``1,2,4`` and inclusive integer ranges ``0-8`` (mixable); every value at most ``maximum``."""
    values: list[int] = []
    for item in text.split(","):
        item = item.strip()
        if len(item) > 40:
            raise click.BadParameter(f"'{item[:40]}...' is too long to be a number ({what}; at most {maximum})")
        try:
            if "-" in item[1:]:
                low_text, high_text = item.split("-", 1)
                low, high = int(low_text), int(high_text)
            else:
                low = high = int(item)
        except ValueError:
            raise click.BadParameter(f"'{item}' is not an integer or a range like 1-8 ({what})") from None
        if high < low:
            raise click.BadParameter(f"'{item}' is an empty range ({what})")
        if high > maximum:
            raise click.BadParameter(f"'{item}' goes beyond {maximum} ({what}; at most {maximum})")
        if high - low + 1 + len(values) > MAX_LIST_VALUES:
            raise click.BadParameter(f"'{item}' is too long ({what}; at most {MAX_LIST_VALUES} values)")
        values.extend(range(low, high + 1))
    return values


def _rates_callback(ctx: click.Context, param: click.Parameter, value: str | None) -> list[float] | None:
    if value is None:
        return None
    rates = parse_number_list(value, "request rates in req/s")
    if any(rate < 0 for rate in rates):
        raise click.BadParameter("request rates must be >= 0 req/s")
    return sorted(set(rates))


#: The most clients ``--concurrency`` takes: beyond any engine's batch of requests.
MAX_CLIENTS = 1_000_000


def counts_callback(what: str, below_one: str) -> Callable[[click.Context, click.Parameter, str | None],
                                                             tuple[int, ...] | None]:
    """A callback for a list (``1,16,64``) or inclusive range (``1-8``) of counts, each >= 1 (``below_one`` says
    why not) and at most :data:`MAX_CLIENTS`: sorted and unique."""

    def callback(ctx: click.Context, param: click.Parameter, value: str | None) -> tuple[int, ...] | None:
        if value is None:
            return None
        counts = parse_int_list(value, what, MAX_CLIENTS)
        if any(n < 1 for n in counts):
            raise click.BadParameter(below_one)
        return tuple(sorted(set(counts)))

    return callback


#: ``--concurrency``: clients of a closed loop.
concurrency_callback = counts_callback("clients of a closed loop", "a closed loop has at least 1 client")


class DraftLengths(click.ParamType):
    """Draft lengths in tokens: a list (``1,2,4``) or an inclusive range (``1-8``), mixable.

    Converts to the lengths of SD, sorted and unique. 0 (SD off) may be given but is not returned: the
    planner always compares no SD, derive always prices it, and calibrate always measures it. With
    ``require_sd`` at least one length must be 1 or more; calibrate takes ``0`` alone (no SD only).
    """

    name = "draft lengths"

    def __init__(self, maximum: int = MAX_DRAFT_LENGTH, require_sd: bool = True) -> None:
        self.maximum, self.require_sd = maximum, require_sd

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> tuple[int, ...]:
        if isinstance(value, tuple):
            return value
        lengths = parse_int_list(str(value), "draft lengths in tokens", self.maximum)
        if any(k < 0 for k in lengths):
            self.fail("draft lengths must be >= 0 tokens (0 means SD off)", param, ctx)
        positive = tuple(sorted({k for k in lengths if k > 0}))
        if self.require_sd and not positive:
            self.fail("give at least one draft length >= 1 (SD off is always included)", param, ctx)
        return positive


def draft_choice_callback(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """``K``, ``best`` or ``off`` (``0`` means off); returns "best", "off" or the number as text."""
    if value is None or value in ("best", "off"):
        return value
    if value == "goodput" and ctx.info_name == "simulate":
        return value
    try:
        k = int(value) if len(value) <= 40 else None
    except ValueError:
        k = None
    if k is None:
        raise click.BadParameter(f"'{value[:40]}' is not a draft length, 'best' or 'off'")
    if k < 0:
        raise click.BadParameter("draft length must be >= 0 (0 means off)")
    if k > MAX_DRAFT_LENGTH:
        raise click.BadParameter(f"draft length {k} is beyond {MAX_DRAFT_LENGTH} tokens; SD drafts a few tokens (1-16)")
    return "off" if k == 0 else str(k)


def positive_tokens(ctx: click.Context, param: click.Parameter, value: int | None) -> int | None:
    if value is not None and value < 1:
        raise click.BadParameter(f"must be >= 1 token, got {value}")
    if value is not None and value > MAX_TOKENS:
        shown = f"{value}" if value < 10**30 else f"a {len(str(value))}-digit number"
        raise click.BadParameter(f"must be at most {MAX_TOKENS} tokens, got {shown}")
    return value


def _fraction_list(ctx: click.Context, param: click.Parameter, value: str | None) -> list[float] | None:
    if value is None:
        return None
    return parse_number_list(value, param.human_readable_name)


def complete_calibration(ctx: click.Context, param: click.Parameter, incomplete: str) -> list[Any]:
    """Shell completion for ``-c``: shipped calibration names, then files (the shell lists them)."""
    from sdplan.calibration import shipped_calibrations

    names = [path.stem for path in shipped_calibrations() if path.stem.startswith(incomplete)]
    return [CompletionItem(name, help="shipped calibration") for name in names] + [CompletionItem(incomplete,
                                                                                                 type="file")]


def complete_file(ctx: click.Context, param: click.Parameter, incomplete: str) -> list[Any]:
    """Shell completion for options that take a path: let the shell list files."""
    return [CompletionItem(incomplete, type="file")]


def calibration_option(fn: FuncT) -> FuncT:
    """``-c/--calibration``: a TOML path or a shipped calibration name."""
    return click.option(
        "-c",
        "--calibration",
        "calibration",
        metavar="FILE|NAME",
        envvar="SDPLAN_CALIBRATION",
        show_envvar=True,
        shell_complete=complete_calibration,
        help="Calibration TOML file, or the name of a shipped one (see 'sdplan calibrations'). "
        "Default: the shipped default calibration.",
    )(fn)


def acceptance_options(fn: FuncT, for_results: bool = False) -> FuncT:
    """Acceptance in any of the three metrics (see sdplan(1), ACCEPTANCE METRICS).

    ``for_results``: the wording of ``fit``/``validate``, where the value fills in what result files lack.
    """
    alpha_help = ("Per-token acceptance probability alpha in [0, 1] of the runs whose files do not record "
                  "acceptance (GuideLLM; vLLM without spec_decode fields); one value." if for_results else
                  "Per-token acceptance probability alpha in [0, 1]; a list or range gives one "
                  "table each (e.g. 0.6,0.8 or 0.5:0.9:0.1). Default: the calibration's measured "
                  "acceptance, else 0.7 (an assumption, flagged in the output).")
    return apply_options(
        fn,
        [
            click.option("--acceptance", "acceptance_alpha", callback=_fraction_list, metavar="ALPHAS",
                         help=alpha_help),
            click.option("--acceptance-length", "acceptance_length", callback=_fraction_list, metavar="TOKENS",
                         help="Mean acceptance length in tokens per cycle, bonus token included "
                         "(vLLM spec_decode_acceptance_length), measured at --acceptance-k."),
            click.option("--draft-acceptance-rate", "draft_acceptance_rate", callback=_fraction_list,
                         metavar="FRACTION", help="Draft acceptance rate: fraction of drafted tokens accepted "
                         "(vLLM spec_decode_acceptance_rate; 0.62 or 62%), measured at --acceptance-k."),
            click.option("--acceptance-k", "acceptance_k", type=click.IntRange(1, MAX_DRAFT_LENGTH), metavar="K",
                         help="Draft length at which --acceptance-length or --draft-acceptance-rate was measured."),
            click.option("--position-acceptance", "position_acceptance", callback=_fraction_list, metavar="RATES",
                         help="Per-position acceptance rates r_1..r_K as vLLM reports them "
                         "(spec_decode_per_position_acceptance_rates: fraction of drafts accepted up to position i), "
                         "instead of one alpha: E(k) = 1 + r_1 + ... + r_k, for k <= K."),
        ],
    )


def workload_options(fn: FuncT) -> FuncT:
    """Prompt/output lengths and acceptance in any of the three metrics."""
    return apply_options(
        fn,
        [
            click.option("--prompt-tokens", type=int, callback=positive_tokens, metavar="TOKENS",
                         help="Prompt length p in tokens. Default: the calibration's reference workload."),
            click.option("--output-tokens", type=int, callback=positive_tokens, metavar="TOKENS",
                         help="Output length g in tokens. Default: the calibration's reference workload."),
            acceptance_options,
            click.option("--acceptance-profile", "acceptance_profile", metavar="FILE", shell_complete=complete_file,
                         help="Acceptance from a speculation_profile.json (NVIDIA Model-Optimizer schema 1.0, next to "
                         "a draft checkpoint; a folder holding one works too): its conditional per-position rates, "
                         "measured at its num_speculative_tokens."),
        ],
    )


def grid_options(fn: FuncT) -> FuncT:
    """Request rates and draft lengths to evaluate."""
    return apply_options(
        fn,
        [
            click.option("-r", "--rates", callback=_rates_callback, metavar="RATES",
                         help="Request rates in req/s: a list (1,2,4) or inclusive START:STOP:STEP "
                         "(0.5:16:0.5), mixable. Default: 12 rates up to the highest saturation rate."),
            click.option("-k", "--draft-lengths", type=DraftLengths(), metavar="KS",
                         help="Draft lengths in tokens: a list (1,2,4) or range (1-8). 0 (SD off) is always "
                         "included. Default: 1-8."),
        ],
    )


def output_options(formats: tuple[str, ...] = ("table", "json", "csv"),
                   to_file: bool = True) -> Callable[[FuncT], FuncT]:
    """``--format``, ``-o/--output`` (unless ``to_file`` is False) and ``--ascii``."""

    def decorate(fn: FuncT) -> FuncT:
        options = [
            click.option("-f", "--format", "fmt", type=click.Choice(formats), default="table", show_default=True,
                         help="Output format. JSON and CSV carry units in every field name."),
            click.option("--ascii", "ascii_only", is_flag=True,
                         help="ASCII table borders and no colour (for logs; NO_COLOR is honoured too)."),
        ]
        if to_file:
            options.insert(1, click.option("-o", "--output", metavar="PATH", shell_complete=complete_file,
                                           help="Write the result to PATH (atomically) instead of stdout; "
                                                "'-' is stdout."))
        return apply_options(fn, options)

    return decorate


def plot_options(fn: FuncT) -> FuncT:
    """``--plot`` (terminal) and ``--plot-file`` (PNG/SVG through matplotlib)."""
    return apply_options(fn, [
        click.option("--plot", is_flag=True, help="Also draw the plots in the terminal (with --format table)."),
        click.option("--plot-file", metavar="PATH", shell_complete=complete_file,
                     help="Write the figure to PATH (.png or .svg); needs the "
                     "'plot' extra (pip install matplotlib, or pip install -e '.[plot]' in a checkout)."),
    ])


def terminal_plot_settings(ascii_only: bool) -> tuple[int, bool]:
    """Width and colour for terminal plots: the terminal's width (80 in logs), colour only on a terminal."""
    width = shutil.get_terminal_size((80, 24)).columns
    color = sys.stdout.isatty() and not ascii_only and "NO_COLOR" not in os.environ
    return max(60, min(width, 160)), color


def check_plot_request(plot: bool, plot_file: str | None, fmt: str) -> None:
    """Validate plot options before any work is done."""
    if plot and fmt != "table":
        raise usage_error("--plot draws in the terminal next to the table; with --format json/csv use --plot-file")
    if plot_file is not None:
        from sdplan.render.plots import check_plot_path

        check_plot_path(plot_file)


def usage_error(message: str) -> click.UsageError:
    """A usage error (exit status 2)."""
    error = click.UsageError(message)
    error.exit_code = int(ExitStatus.USAGE)  # type: ignore[misc]  # click declares exit_code on the class
    return error
