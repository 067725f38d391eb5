"""``sdplan calibrate``: measure a calibration on a served vLLM (default) or its bare engine."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import click

from sdplan.cli._options import DraftLengths, usage_error
from sdplan.errors import ExitStatus, InvalidValueError
from sdplan.inputs.methods import check_method
from sdplan.limits import MAX_SERVED_DRAFT_LENGTH

if TYPE_CHECKING:
    from sdplan.measure.engine import EngineOptions
    from sdplan.measure.options import ServedOptions
    from sdplan.measure.sweep import SweepEvents

GRID_NAMES = ("quick", "standard", "thorough")


def _spec_method(ctx: click.Context, param: click.Parameter, value: str) -> str:
    """A method sdplan models, checked before anything starts (exit 2)."""
    try:
        return check_method(value)
    except InvalidValueError as error:
        raise usage_error(str(error)) from None


#: Mean prompt and output lengths of the random prompts of a served calibration, unless given.
PROMPT_TOKENS = 512
OUTPUT_TOKENS = 128


def _none_when_default(ctx: click.Context, param: click.Parameter, value: int) -> int | None:
    """None when the option was not given (its default shows in the help): with --dataset, given or not differs."""
    return None if ctx.get_parameter_source(param.name or "") is click.core.ParameterSource.DEFAULT else value


@click.command(context_settings={"ignore_unknown_options": False})
@click.option("--target", metavar="MODEL", help="Target (verifier) model folder or name, served with vllm serve.")
@click.option("--draft", metavar="MODEL", help="Draft model (draft_model, eagle, eagle3). Not needed for ngram/mtp.")
@click.option("--endpoint", metavar="URL",
              help="Measure a vLLM server you already run (one configuration per invocation; results merge into "
              "--results-dir with --resume). Its SD setting is read from the results.")
@click.option("--label", metavar="NAME",
              help="With --endpoint: the configuration's name in the results folder. Default: from the server's "
              "spec-decode metrics (ep-nosd, ep-k4).")
@click.option("-o", "--output", required=True, metavar="FILE", help="Calibration TOML to write (atomically).")
@click.option("--name", metavar="NAME", help="Calibration name. Default: the output file's stem.")
@click.option("--method", "measure_method", type=click.Choice(("served", "engine")), default="served",
              show_default=True, help="served: vllm serve + vllm bench serve, what users deploy. engine: time bare "
              "in-process engine steps (excludes the API server, detokenisation, streaming and IPC; a "
              "decomposition, not a prediction of a served system).")
@click.option("--spec-method", default="draft_model", show_default=True, metavar="METHOD", callback=_spec_method,
              help="vLLM speculative method of the SD configurations: draft_model, ngram, eagle, eagle3 or mtp "
              "(suffix is refused: its draft length varies per step).")
@click.option("--draft-lengths", type=DraftLengths(MAX_SERVED_DRAFT_LENGTH, require_sd=False), metavar="LIST",
              help="Draft lengths k to serve, e.g. 2,4 or 1-4; 0 measures no SD only. Default: the grid's.")
@click.option("--prompt-tokens", type=click.IntRange(1, 1_000_000), default=PROMPT_TOKENS, show_default=True,
              callback=_none_when_default, metavar="TOKENS",
              help="Mean prompt length of the random prompts (served, +-25%); the calibration's "
              "reference workload.")
@click.option("--output-tokens", type=click.IntRange(2, 1_000_000), default=OUTPUT_TOKENS, show_default=True,
              callback=_none_when_default, metavar="TOKENS",
              help="Mean output length (served, +-25%; EOS ignored). With --dataset: every "
              "request's; default there: each line's output_tokens when all lines have one.")
@click.option("--dataset", metavar="FILE.jsonl",
              help='served: your prompts instead of random ones, vLLM\'s custom format: one {"prompt": "text", '
              '"output_tokens": 128} per line (output_tokens optional), sent as written. Acceptance is measured on '
              "them (n-gram needs text that repeats). Give more prompts than the largest point's requests, or "
              "repeats hit the prefix cache.")
@click.option("--grid", type=click.Choice(GRID_NAMES), default="quick", show_default=True,
              help="served: quick = N 1,4,16,64, probes of no SD, 2 Poisson points, 2 server instances per "
              "configuration; standard = N 1..64, probes of every configuration, 2 repeats, 3 Poisson points; "
              "thorough = N 1..128, 3 repeats. engine: batch x k x prompt grid (sdplan-calibrate(1)).")
@click.option("--repeats", type=click.IntRange(1, 10), default=None, metavar="N",
              help="served: measure every point N times, each in its own round of fresh servers (the order of "
              "the configurations reversed every other round), so that a machine whose speed moves over minutes "
              "shows it and the fit averages it. Default: the grid's (quick 1, standard 2, thorough 3).")
@click.option("--poisson-seconds", type=click.FloatRange(min=1, max=3600), default=None,
              metavar="SECONDS", help="served: target length of each Poisson point (default: quick 8, standard and "
              "thorough 15; at least 2x the grid's smallest point in requests and 20 mean latencies of the N=1 "
              "point, up to 600 s); longer averages out more of a noisy machine.")
@click.option("--serve-arg", "serve_args", multiple=True, metavar="ARG",
              help="A vllm serve flag passed through unchanged, repeatable (e.g. --serve-arg=--enforce-eager); "
              "or put the flags after --.")
@click.option("--max-num-seqs", type=click.IntRange(min=1), metavar="N",
              help="vLLM max_num_seqs (passed to vllm serve); caps the closed-loop clients. Default: vLLM's for "
                   "the machine (128 on a CPU), up to which the sweep goes while the next doubling of the clients "
                   "is forecast to gain 10%.")
@click.option("--max-num-batched-tokens", type=click.IntRange(min=1), metavar="TOKENS",
              help="vLLM max_num_batched_tokens (passed to vllm serve).")
@click.option("--dtype", default=None, metavar="DTYPE", help="Model dtype passed to vLLM (auto, bfloat16, float32).")
@click.option("--tensor-parallel-size", type=click.IntRange(min=1), default=None, metavar="N", help="GPUs per replica.")
@click.option("--max-model-len", type=click.IntRange(min=16), metavar="TOKENS",
              help="Engine context length. Default (engine): enough for the grid; (served): vLLM's.")
@click.option("--load-format", type=click.Choice(("auto", "dummy")), default=None,
              help="'dummy' serves random weights from config.json alone (timing needs no real weights; "
              "acceptance is then meaningless).")
@click.option("--temperature", type=click.FloatRange(min=0), default=0.0, show_default=True,
              help="Sampling temperature of the benchmark requests (acceptance depends on it).")
@click.option("--results-dir", metavar="DIR",
              help="served: where the vllm bench serve results, server logs and manifest go. "
              "Default: OUTPUT with suffix .runs.")
@click.option("--server-timeout", type=click.FloatRange(min=1), default=900.0, show_default=True, metavar="SECONDS",
              help="served: how long vllm serve may take to become healthy.")
@click.option("--accept-poor-fit", is_flag=True,
              help="Exit 0 even when the calibration's own points are poorly predicted (it is written either way).")
@click.option("--enforce-eager/--no-enforce-eager", default=None,
              help="Disable CUDA graphs / compilation (passed to vllm). "
                   "Default: vLLM's (served); eager on CPU (engine).")
@click.option("--acceptance-prompts", metavar="FILE",
              help='engine: JSON Lines of {"prompt_token_ids": [...]} to measure acceptance on.')
@click.option("--acceptance-output-tokens", type=click.IntRange(min=1), default=128, show_default=True,
              metavar="TOKENS", help="engine: tokens generated per prompt when measuring acceptance.")
@click.option("--synthetic-acceptance", type=click.FloatRange(0, 1), metavar="ALPHA",
              help="engine, GPU only: impose per-token acceptance ALPHA with vLLM's synthetic rejection sampling.")
@click.option("--measurements-out", metavar="PATH", help="engine: where raw step timings are saved (.jsonl/.csv).")
@click.option("--resume", is_flag=True, help="Continue an interrupted run from its results (served) or measurements.")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed for prompts and sampling.")
@click.argument("extra_serve_args", nargs=-1, type=click.UNPROCESSED, metavar="[-- VLLM_SERVE_FLAGS...]")
def calibrate(target: str | None, draft: str | None, endpoint: str | None, label: str | None, output: str,
              name: str | None,
              measure_method: str, spec_method: str, draft_lengths: tuple[int, ...] | None,
              prompt_tokens: int | None, output_tokens: int | None, dataset: str | None, grid: str, repeats: int | None,
              poisson_seconds: float | None, serve_args: tuple[str, ...], max_num_seqs: int | None,
              max_num_batched_tokens: int | None, dtype: str | None, tensor_parallel_size: int | None,
              max_model_len: int | None, load_format: str | None, temperature: float, results_dir: str | None,
              server_timeout: float, accept_poor_fit: bool, enforce_eager: bool | None,
              acceptance_prompts: str | None, acceptance_output_tokens: int, synthetic_acceptance: float | None,
              measurements_out: str | None, resume: bool, seed: int, extra_serve_args: tuple[str, ...]) -> ExitStatus:
    """Measure a calibration on this machine with real vLLM.

    By default (--method served) it starts `vllm serve` itself on 127.0.0.1
    and a free port, once per configuration (no SD, then SD at each draft
    length), loads it with vLLM's own `vllm bench serve` in a closed-loop
    concurrency sweep (N = 1, 4, 16, 64, ... up to max_num_seqs, the
    requests its KV cache holds, or until throughput stops rising), and
    fits L = C1 + B*C2 and TTFT = c1p + w1*tau1 + B*w2*tau2 to the measured
    points with the same machinery as `sdplan fit`. Every point is an
    ordinary vLLM result file kept in --results-dir; servers are always
    stopped (also on Ctrl-C and failure); --resume continues. Points during
    which other processes used CPU are measured again. A calibration whose
    own points are predicted worse than 10% MAPE (or R2 < 0.9) is written but
    exits 7, unless --accept-poor-fit.

    Measure on the machine you will serve from, alone: VMs of one kind
    differ up to 2x, and a concurrent CPU-bound process inflates vLLM's CPU
    steps 10-50x. Needs vLLM in this Python (pip install -e '.[calibrate]').

    \b
    Examples:
      sdplan calibrate --target ./llama-8b --draft ./llama-1b \\
                       --draft-lengths 2,4 -o mybox.toml
      sdplan calibrate --target ./tiny --draft ./tiny-draft -o cpu.toml \\
                       -- --dtype float32 --max-num-seqs 16
      sdplan calibrate --target ./llama-8b --spec-method ngram \\
                       --dataset chats.jsonl -o ngram.toml
      sdplan calibrate --endpoint http://127.0.0.1:8000 -o mine.toml \\
                       --results-dir runs --resume
      sdplan plan -c mybox.toml

    \b
    Exit status: 0 ok, 2 bad options (found before anything starts), 3 bad
    results folder, 4 too few usable points, 5 vLLM missing, 6 engine or
    server failure, 7 poor calibration (written), 130 interrupted (results kept).
    """
    out = _calibration_file(output)  # before any path is derived from it
    if measure_method == "engine":
        from sdplan.measure.engine import EngineOptions

        _refuse_served_options(target, endpoint, serve_args + extra_serve_args, dataset, repeats)
        assert target is not None  # (refused above)
        _calibrate_engine(EngineOptions(
            target=target, draft=draft, grid_name=grid,
            measurements_path=Path(measurements_out) if measurements_out else out.with_suffix(".measurements.jsonl"),
            dtype=dtype or "auto", tensor_parallel_size=tensor_parallel_size or 1, max_model_len=max_model_len,
            load_format=load_format or "auto", enforce_eager=enforce_eager, acceptance_prompts=acceptance_prompts,
            acceptance_output_tokens=acceptance_output_tokens, temperature=temperature,
            synthetic_acceptance=synthetic_acceptance, resume=resume, seed=seed), out, name)
        return ExitStatus.OK
    if dataset is not None:
        output_tokens = _dataset_output_tokens(prompt_tokens, output_tokens)
    _refuse_engine_options({"--acceptance-prompts": acceptance_prompts,
                            "--synthetic-acceptance": synthetic_acceptance, "--measurements-out": measurements_out})
    passthrough = _serving_flags(serve_args + extra_serve_args, endpoint, enforce_eager, {
        "--max-num-seqs": max_num_seqs, "--max-num-batched-tokens": max_num_batched_tokens, "--dtype": dtype,
        "--tensor-parallel-size": tensor_parallel_size, "--max-model-len": max_model_len,
        "--load-format": load_format})
    from sdplan.measure.options import ServedOptions

    options = ServedOptions(
        target=target, draft=draft, endpoint=endpoint, method=spec_method,
        draft_lengths=_served_draft_lengths(draft_lengths, grid, draft, spec_method, endpoint),
        prompt_tokens=prompt_tokens if prompt_tokens is not None else PROMPT_TOKENS,
        output_tokens=output_tokens if output_tokens is not None else OUTPUT_TOKENS, grid_name=grid,
        serve_arguments=passthrough,
        results_dir=Path(results_dir) if results_dir else out.with_suffix(".runs"), temperature=temperature,
        seed=seed, resume=resume, server_timeout_s=server_timeout, label=label,
        dataset=Path(dataset) if dataset is not None else None, poisson_seconds=poisson_seconds, repeats=repeats)
    return _calibrate_served(options, output, name, accept_poor_fit)


def _served_draft_lengths(given: tuple[int, ...] | None, grid: str, draft: str | None, method: str,
                          endpoint: str | None) -> tuple[int, ...]:
    """The draft lengths to serve: --draft-lengths, else the grid's where the method can draft (with a --draft
    model, or a method that needs none); none with --endpoint, whose SD setting the results say."""
    from sdplan.measure.levels import SERVED_GRIDS
    from sdplan.measure.options import METHODS_WITH_MODEL

    if endpoint is not None:
        return ()
    if given is not None:
        return given
    return SERVED_GRIDS[grid].draft_lengths if (draft is not None or method not in METHODS_WITH_MODEL) else ()


def _dataset_output_tokens(prompt_tokens: int | None, output_tokens: int | None) -> int:
    """With --dataset the prompts are the file's: --prompt-tokens is refused, and without --output-tokens each
    line's own output_tokens are sent (0; checked with the file). None: the option was not given."""
    if prompt_tokens is not None:
        raise click.UsageError("--prompt-tokens sets random prompts; with --dataset the prompts are the file's")
    if output_tokens is None:
        return 0  # each line's output_tokens, when every line has one (checked with the file)
    return output_tokens


def _refuse_engine_options(given: dict[str, object]) -> None:
    """Served calibrations refuse the options of --method engine (``given``: flag to value, None where not
    given)."""
    for flag, value in given.items():
        if value is not None:
            raise click.UsageError(f"{flag} belongs to --method engine; served calibrations measure acceptance "
                                   "from the server's spec-decode counters")


def _refuse_served_options(target: str | None, endpoint: str | None, serving_flags: tuple[str, ...],
                           dataset: str | None, repeats: int | None) -> None:
    """--method engine starts its own engine in-process: the options of a served calibration are usage errors."""
    if target is None or endpoint is not None or serving_flags:
        raise click.UsageError("--method engine takes --target (and --draft), not --endpoint or serving flags")
    if dataset is not None:
        raise click.UsageError("--dataset is for served calibrations; --method engine measures acceptance on "
                               "--acceptance-prompts")
    if repeats is not None:
        raise click.UsageError("--repeats is for served calibrations; --method engine repeats as its --grid says")


def _serving_flags(passthrough: tuple[str, ...], endpoint: str | None, enforce_eager: bool | None,
                   options: dict[str, object]) -> tuple[str, ...]:
    """The ``vllm serve`` flags: those passed through, then sdplan's own options that configure the server
    (``options``: flag to value, None where not given), each given once, and none with --endpoint."""
    flags = list(passthrough)
    for flag, value in options.items():
        if value is not None:
            if any(arg == flag or arg.startswith(flag + "=") for arg in passthrough):
                raise click.UsageError(f"{flag} is given twice (as an option and as a serving flag); keep one")
            if endpoint is not None:
                raise click.UsageError(f"{flag} configures a server sdplan starts; with --endpoint set it on yours")
            flags += [flag, str(value)]
    if enforce_eager is not None:
        flags.append("--enforce-eager" if enforce_eager else "--no-enforce-eager")
    return tuple(flags)


def _calibrate_served(options: ServedOptions, output: str, name: str | None, accept_poor_fit: bool) -> ExitStatus:
    """Measure and write a served calibration with a progress bar; POOR_CALIBRATION (said on stderr) when its
    fit is poor."""
    from sdplan.measure.calibrate import calibrate_served
    from sdplan.render import say

    outcome = calibrate_served(options, Path(output), name, accept_poor_fit, _sweep_progress)
    if outcome.rejected is not None:
        say(f"sdplan calibrate: poor calibration: the fit of these points is not a usable calibration "
            f"({outcome.rejected}); nothing written, the {outcome.points} points are "
            f"kept in {outcome.results_dir}: measure again on a quiet machine (--resume adds points) or "
            "with a larger --grid")
        return ExitStatus.POOR_CALIBRATION
    fit = outcome.fit
    ttft = f", TTFT MAPE {fit.ttft_mape_pct:.1f}%" if fit.ttft_mape_pct is not None else ""
    say(f"wrote {outcome.output}: {fit.points} points, mean E2E MAPE {fit.mape_pct:.1f}%, R2 {fit.r2:.3f}"
        f"{ttft}; {outcome.wall_s:.0f} s measured")
    if outcome.poor:
        say(f"sdplan calibrate: poor calibration ({'; '.join(outcome.poor_reasons)}); it was written, but "
            "check the machine is quiet and re-measure (--resume adds points), or pass --accept-poor-fit")
        return ExitStatus.POOR_CALIBRATION
    return ExitStatus.OK


@contextlib.contextmanager
def _sweep_progress(planned_points: int) -> Iterator[SweepEvents]:
    """The sweep's listeners drawing a progress bar of ``planned_points`` (more as the sweep finds more), and
    its notes on stderr."""
    from sdplan.measure.sweep import SweepEvents
    from sdplan.render import say
    from sdplan.render.progress import progress_bar

    planned = [planned_points]
    with progress_bar("measuring", planned[0]) as advance:
        count = [0]

        def on_point(description: str) -> None:
            planned[0] = max(planned[0], count[0] + 1)  # levels past the grid's, re-measures: more points
            advance(count[0], planned[0], description)

        def on_done(record: object) -> None:
            count[0] += 1
            planned[0] = max(planned[0], count[0])
            advance(count[0], planned[0], "")

        def on_note(note: str) -> None:
            say(f"note: {note}")

        yield SweepEvents(on_point=on_point, on_done=on_done, on_note=on_note)
        advance(planned[0], planned[0], "done")


def _calibrate_engine(options: EngineOptions, out: Path, name: str | None) -> None:
    from sdplan.measure.calibrate import calibrate_engine
    from sdplan.render import say
    from sdplan.render.progress import progress_bar

    outcome = calibrate_engine(options, out, name, progress_bar)
    say(f"wrote {outcome.output}: fit R2 {outcome.r2:.4f} over {outcome.measurements} measurements "
        f"in {outcome.seconds:.1f} s")


def _calibration_file(output: str) -> Path:
    """The calibration file ``-o`` names; a folder is a usage error (the runs and the store are named after it)."""
    out = Path(output)
    if out.is_dir():
        raise click.UsageError(f"-o {output} is a folder; name the calibration file to write")
    return out
