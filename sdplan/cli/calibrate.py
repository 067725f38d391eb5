"""``sdplan calibrate``: measure a calibration with the real vLLM engine."""

from __future__ import annotations

from pathlib import Path

import click

GRID_NAMES = ("quick", "standard", "thorough")


def _read_prompts(path: str) -> list[list[int]]:
    """Prompt token ids from a JSON Lines file: one {"prompt_token_ids": [...]} per line."""
    import json

    from sdplan.errors import InputFileError

    prompts = []
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except OSError as error:
        raise InputFileError(path, None, f"cannot read ({error.strerror}); check the path") from None
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            ids = json.loads(line)["prompt_token_ids"]
            if not ids or not all(isinstance(i, int) and i >= 0 for i in ids):
                raise ValueError
        except (ValueError, KeyError, TypeError):
            raise InputFileError(path, f"line {number}",
                                 'expected {"prompt_token_ids": [non-negative integers, ...]}') from None
        prompts.append(ids)
    if not prompts:
        raise InputFileError(path, None, "no prompts; add JSON lines with prompt_token_ids")
    return prompts


def _relative(path: Path, output: Path) -> str:
    """``path`` relative to the calibration's folder when it lies there (keeps the file portable)."""
    try:
        return str(path.resolve().relative_to(output.resolve().parent))
    except ValueError:
        return str(path)


@click.command()
@click.option("--target", required=True, metavar="MODEL", help="Target (verifier) model: a local folder or a name.")
@click.option("--draft", metavar="MODEL", help="Draft model. Without it, draft costs are zero (n-gram-like proposer).")
@click.option("-o", "--output", required=True, metavar="FILE", help="Calibration TOML to write (atomically).")
@click.option("--name", metavar="NAME", help="Calibration name. Default: the output file's stem.")
@click.option("--grid", type=click.Choice(GRID_NAMES), default="standard", show_default=True,
              help="Measurement grid: batch sizes x draft lengths x prompt lengths (see sdplan-calibrate(1)).")
@click.option("--dtype", default="auto", show_default=True, metavar="DTYPE",
              help="Model dtype passed to vLLM (auto, bfloat16, float16, float32).")
@click.option("--tensor-parallel-size", type=click.IntRange(min=1), default=1, show_default=True, metavar="N",
              help="GPUs per replica.")
@click.option("--max-model-len", type=click.IntRange(min=16), metavar="TOKENS",
              help="Engine context length. Default: enough for the grid's longest prompt and decode.")
@click.option("--load-format", type=click.Choice(("auto", "dummy")), default="auto", show_default=True,
              help="'dummy' times with random weights from config.json alone (timing does not need real weights); "
              "acceptance is always measured with real weights.")
@click.option("--enforce-eager/--no-enforce-eager", default=None,
              help="Disable CUDA graphs / compilation. Default: eager on CPU, graphs on GPU.")
@click.option("--acceptance-prompts", metavar="FILE",
              help='JSON Lines of {"prompt_token_ids": [...]}: measure acceptance on them from vLLM\'s counters.')
@click.option("--acceptance-output-tokens", type=click.IntRange(min=1), default=128, show_default=True,
              metavar="TOKENS", help="Tokens generated per prompt when measuring acceptance.")
@click.option("--temperature", type=click.FloatRange(min=0), default=0.0, show_default=True,
              help="Sampling temperature when measuring acceptance.")
@click.option("--synthetic-acceptance", type=click.FloatRange(0, 1), metavar="ALPHA",
              help="GPU only: impose per-token acceptance ALPHA in the SD timing runs with vLLM's synthetic "
              "rejection sampling (separates cost from acceptance).")
@click.option("--measurements-out", metavar="PATH",
              help="Where raw timings are saved as they are measured (.jsonl or .csv). "
              "Default: OUTPUT with suffix .measurements.jsonl.")
@click.option("--resume", is_flag=True, help="Continue an interrupted run from its measurements file.")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed for prompts and sampling.")
def calibrate(target: str, draft: str | None, output: str, name: str | None, grid: str, dtype: str,
              tensor_parallel_size: int, max_model_len: int | None, load_format: str, enforce_eager: bool | None,
              acceptance_prompts: str | None, acceptance_output_tokens: int, temperature: float,
              synthetic_acceptance: float | None, measurements_out: str | None, resume: bool, seed: int) -> None:
    """Measure a calibration on this machine with the real vLLM engine.

    Times target decode and verify steps over batch sizes x tokens per
    sequence x context lengths (verify steps with a zero-cost proposer), real
    SD steps with the draft model, and prefill; fits the per-step model with
    non-negative least squares and writes a calibration TOML with provenance
    and fit quality. Measurements are saved as they come: an interrupted run
    keeps them and --resume continues. Needs the [calibrate] extra.

    \b
    Examples:
      sdplan calibrate --target meta-llama/Llama-3.1-8B-Instruct \\
                       --draft meta-llama/Llama-3.2-1B-Instruct -o mybox.toml
      sdplan calibrate --target ./cfg-8b --draft ./cfg-1b --load-format dummy --grid quick -o quick.toml
      sdplan plan -c mybox.toml
    """
    import datetime
    import time

    from sdplan import __version__
    from sdplan._vllm import EngineSettings, VllmRunner
    from sdplan.calibrate import GRIDS, MeasurementStore, calibration_document, fit_calibration, measure, plan_tasks
    from sdplan.calibration import parse_calibration
    from sdplan.fileio import atomic_write_text, dumps_toml
    from sdplan.render import progress_bar

    chosen = GRIDS[grid]
    out = Path(output)
    store_path = Path(measurements_out) if measurements_out else out.with_suffix(".measurements.jsonl")
    prompts = _read_prompts(acceptance_prompts) if acceptance_prompts else None
    longest = max(chosen.prompt_tokens + chosen.prefill_tokens)
    needed = longest + chosen.decode_steps * (max(chosen.draft_lengths) + 1) + 32
    if prompts:
        needed = max(needed, max(len(p) for p in prompts) + acceptance_output_tokens + max(chosen.draft_lengths) + 16)
    settings = EngineSettings(
        target=target, draft=draft, dtype=dtype, tensor_parallel_size=tensor_parallel_size,
        max_model_len=max_model_len or needed, max_num_seqs=max(max(chosen.batch_sizes), len(prompts or [])),
        load_format=load_format, enforce_eager=enforce_eager, seed=seed, synthetic_acceptance=synthetic_acceptance,
    )
    config = {"target": target, "draft": draft, "dtype": dtype, "tensor_parallel_size": tensor_parallel_size,
              "grid": grid, "load_format": load_format, "synthetic_acceptance": synthetic_acceptance}
    started = time.perf_counter()
    runner = VllmRunner(settings)  # imports vLLM first: nothing is written when it is missing
    store = MeasurementStore(store_path, config)
    done = store.start(resume)
    try:
        tasks = plan_tasks(chosen, with_draft=draft is not None)
        with progress_bar("measuring", len(tasks)) as advance:
            measurements = measure(tasks, runner, chosen, store, done, on_progress=advance)
        acceptance = None
        if prompts:
            if not draft:
                raise click.UsageError("--acceptance-prompts needs --draft")
            counts = runner.acceptance(prompts, max(chosen.draft_lengths), acceptance_output_tokens, temperature)
            acceptance = counts.document(f"{len(prompts)} prompts from {acceptance_prompts}, temperature {temperature:g}")
        engine = runner.describe()
    finally:
        runner.close()
    fit = fit_calibration(measurements)
    document = calibration_document(
        name=name or out.stem, fit=fit, engine=engine, target=target, draft=draft, dtype=dtype,
        tensor_parallel_size=tensor_parallel_size, grid_name=grid, grid=chosen, load_format=load_format,
        wall_seconds=time.perf_counter() - started, measurements_path=_relative(store_path, out), acceptance=acceptance,
        today=datetime.date.today(), version=__version__,
    )
    parse_calibration(document, str(out))  # never write a file sdplan itself would reject
    atomic_write_text(out, dumps_toml(document, header="Measured with 'sdplan calibrate'; raw timings in "
                                                       f"{store_path.name}."))
    click.echo(f"wrote {out}: fit R2 {fit.r2:.4f} over {len(measurements)} measurements "
               f"in {time.perf_counter() - started:.1f} s", err=True)
