"""``sdplan derive``: a calibration priced by NVIDIA AIConfigurator's silicon op database."""

from __future__ import annotations

import datetime
import sys
from pathlib import Path

import click

from sdplan.cli._options import DraftLengths, output_options
from sdplan.fileio import atomic_write_text
from sdplan.limits import MAX_SERVED_DRAFT_LENGTH


@click.command()
@click.option("--target-model", required=True, metavar="NAME",
              help="Target model: a Hugging Face name AIConfigurator knows (e.g. Qwen/Qwen3-32B, "
              "meta-llama/Llama-3.1-8B-Instruct; also matched up to case, without the organisation, as a dated "
              "re-release such as -2507, or as an -FP8 checkpoint at --precision fp8) or a folder with its "
              "config.json.")
@click.option("--system", required=True, metavar="GPU",
              help="AIConfigurator system: h100_sxm, h200_sxm, b200_sxm, b300_sxm, a100_sxm, l40s, gb200 or gb300.")
@click.option("--method", "speculative_method", required=True,
              type=click.Choice(("draft_model", "eagle", "eagle3", "mtp", "ngram")),
              help="SD method (vLLM's names).")
@click.option("--draft-model", metavar="NAME",
              help="draft_model: the draft LM (a name or a config.json folder); eagle/eagle3: the head's name.")
@click.option("--backend", default="vllm", show_default=True, type=click.Choice(("vllm", "sglang", "trtllm")),
              help="Serving engine whose op database prices the steps.")
@click.option("--backend-version", metavar="VERSION",
              help="Version of that database. Default: AIConfigurator's current one for the system.")
@click.option("--tensor-parallel-size", "--tp", "tensor_parallel_size", type=click.IntRange(1, 64), default=1,
              show_default=True, help="GPUs per replica.")
@click.option("--draft-tp", "draft_tensor_parallel_size", type=click.IntRange(1, 64), metavar="N",
              help="GPUs the draft model runs on (vLLM's draft_tensor_parallel_size). Default: the target's.")
@click.option("--precision", default="bf16", show_default=True,
              type=click.Choice(("bf16", "fp8", "fp8_block", "nvfp4")),
              help="Weights precision (fp8_block: DeepSeek's blockwise FP8; nvfp4: NVIDIA's 4-bit format, "
              "priced on Blackwell GPUs).")
@click.option("--draft-precision", type=click.Choice(("bf16", "fp8", "fp8_block", "nvfp4")),
              help="The draft model's or EAGLE head's weights precision. Default: its checkpoint's own, as vLLM "
              "loads it (bf16 for an unquantised checkpoint or a head), whatever --precision says; MTP layers "
              "take --precision.")
@click.option("--kv-cache-dtype", default="auto", show_default=True, type=click.Choice(("auto", "bf16", "fp8")),
              help="The KV cache's dtype (vLLM's --kv-cache-dtype). auto: float8 where the checkpoint declares an "
              "fp8 cache (kv_cache_quant_algo), else bfloat16, as vLLM serves it; it sets the requests the cache "
              "holds.")
@click.option("--draft-lengths", default="1-5", show_default=True, type=DraftLengths(MAX_SERVED_DRAFT_LENGTH),
              metavar="LIST",
              help="Draft lengths k to price verification at (k+1 tokens per sequence).")
@click.option("--max-num-seqs", type=click.IntRange(1, 4096), metavar="N",
              help="The engine's largest batch; the priced batch sizes stop there or where the KV cache is full. "
              "Default: the engine's own on --system (vLLM: 1024 on H100, H200 and B200, 256 on A100 and L40S; "
              "SGLang: 2048; TensorRT-LLM: 256).")
@click.option("--prompt-tokens", type=click.IntRange(1, 1_000_000), default=1024, show_default=True,
              help="Reference prompt length of the file.")
@click.option("--output-tokens", type=click.IntRange(1, 1_000_000), default=512, show_default=True,
              help="Reference output length of the file.")
@click.option("--no-anchor", is_flag=True,
              help="Do not anchor to AIConfigurator's measured rows (silicon_sample.csv) even where they exist.")
@click.option("--date", "date_text", metavar="YYYY-MM-DD",
              help="Date written into the file. Default: today (fix it for byte-reproducible files).")
@click.option("--name", metavar="NAME", help="Calibration name. Default: the output file's stem.")
@click.option("-o", "--output", "calibration_out", required=True, metavar="FILE",
              help="Calibration TOML to write (atomically); - for stdout.")
@output_options(formats=("table", "json"), to_file=False)
def derive(target_model: str, system: str, speculative_method: str, draft_model: str | None, backend: str,
           backend_version: str | None, tensor_parallel_size: int, draft_tensor_parallel_size: int | None,
           precision: str, draft_precision: str | None, kv_cache_dtype: str, draft_lengths: tuple[int, ...],
           max_num_seqs: int | None, prompt_tokens: int, output_tokens: int, no_anchor: bool, date_text: str | None,
           name: str | None, calibration_out: str, fmt: str, ascii_only: bool) -> None:
    """Derive a calibration from NVIDIA AIConfigurator's silicon-measured op database.

    Prices target decode and verification steps (k+1 tokens per sequence),
    prefill and its interference with decode, and the draft's own steps with
    AIConfigurator's step estimator, over batch sizes up to --max-num-seqs and
    the KV cache its memory model allows; fits sdplan's per-step form and
    records how well it represents the priced curve, the provenance and the
    assumptions. Where AIConfigurator's measured rows (silicon_sample.csv)
    cover the target, GPU, TP and precision, the no-SD part is anchored to
    them and the measured-vs-derived gap recorded. Needs the optional extra:
    pip install aiconfigurator-core==0.12.0, or pip install -e '.[derive]' in
    a checkout (exit 5 without it).

    \b
    Examples:
      sdplan derive --target-model Qwen/Qwen3-32B --system h100_sxm --tp 2 \\
        --method eagle3 --draft-model RedHatAI/Qwen3-32B-speculator.eagle3 \\
        -o q32.toml
      sdplan derive --target-model meta-llama/Llama-3.1-8B-Instruct \\
        --system h100_sxm --method ngram -o ngram.toml --format json
    """
    from sdplan.derive import DeriveRequest, derive_file
    from sdplan.render import OutputFormat, emit, report_target, say
    from sdplan.render.calibration import render_derivation

    try:
        date = datetime.date.fromisoformat(date_text) if date_text else datetime.date.today()
    except ValueError:
        raise click.BadParameter(f"'{date_text}' is not a date; write YYYY-MM-DD", param_hint="--date") from None
    to_stdout = calibration_out == "-"
    out = Path("derived.toml" if to_stdout else calibration_out)
    request = DeriveRequest(
        target_model=target_model, system=system, method=speculative_method, draft_model=draft_model,
        backend=backend, backend_version=backend_version, tensor_parallel_size=tensor_parallel_size,
        draft_tensor_parallel_size=draft_tensor_parallel_size, precision=precision, draft_precision=draft_precision,
        kv_cache_dtype=kv_cache_dtype, draft_lengths=draft_lengths,
        max_num_seqs=max_num_seqs, prompt_tokens=prompt_tokens,
        output_tokens=output_tokens, name=name or (None if to_stdout else out.stem), date=date, anchor=not no_anchor)
    derived = derive_file(request, str(out), progress=say)
    style, terminal = report_target(to_stdout, ascii_only)
    rendered = render_derivation(derived.calibration, OutputFormat(fmt), style, terminal)
    if to_stdout:
        sys.stdout.write(derived.text)
        click.echo(rendered, err=True, nl=False)
        return
    atomic_write_text(out, derived.text)
    emit(rendered, None)
