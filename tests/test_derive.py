"""``sdplan derive``: calibrations priced by AIConfigurator (aiconfigurator-core, in the 'test' extra)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from sdplan.calibration import (
    load_calibration,
    parse_calibration,
    resolve_calibration,
    shipped_calibrations,
)
from sdplan.derive import layout_hint
from sdplan.errors import ExitStatus, InputFileError, InvalidValueError

REPO = Path(__file__).resolve().parent.parent
#: A shipped file anchored to measured rows (Qwen3-32B BF16, H100 TP2, vLLM): it exercises the whole derivation.
ANCHORED = "2xh100-sxm_qwen3-32b_eagle3_derived"
ANCHORED_FILE = f"{ANCHORED}.toml"


def _aic():
    return pytest.importorskip("aiconfigurator_core.sdk.engine",
                               reason="aiconfigurator-core is not installed (pip install -e '.[test]' on Python 3.11+)")


def test_a_priced_point_is_aiconfigurators_own_estimate() -> None:
    """The decode step sdplan prices is AIConfigurator's decode step for the same inputs, in seconds."""
    engine = _aic()
    from sdplan.derive import DeriveRequest, Models, Pricer, load_aic

    request = DeriveRequest(target_model="Qwen/Qwen3-32B", system="h100_sxm", method="ngram",
                            tensor_parallel_size=2)
    models = Models()
    try:
        pricer = Pricer(load_aic(), request, models)
        ours = pricer.verify(32, 1, 2048)
        verify = pricer.verify(32, 4, 2048)
    finally:
        models.close()
    handle = engine.EngineHandle.compile("Qwen/Qwen3-32B", "h100_sxm", "vllm", backend_version="0.24.0",
                                         tp_size=2, gemm_quant_mode="bfloat16")
    theirs = handle.decode_step_latency(32, 2046, 2) / 1e3  # s = isl + osl // 2 + 1
    assert ours == pytest.approx(theirs, rel=1e-12)
    # verifying 4 tokens per sequence: AIConfigurator's MTP verification (batch x 4 rows) bounds it from above,
    # as it reads each sequence's KV cache 4 times where the kernel reads it once
    assert theirs < verify < handle.decode_step_latency(128, 2046, 2) / 1e3


@pytest.mark.parametrize(("name", "target", "draft"), [
    ("h100-sxm_llama-3.1-8b_llama-3.2-1b_derived", "meta-llama/Llama-3.1-8B-Instruct",
     "meta-llama/Llama-3.2-1B-Instruct"),
    ("h100-sxm_qwen3-30b-a3b_qwen3-0.6b_derived", "Qwen/Qwen3-30B-A3B", "Qwen/Qwen3-0.6B"),
])
def test_a_derived_prefill_follows_the_priced_one_from_short_to_long_prompts(name: str, target: str,
                                                                             draft: str) -> None:
    """The shipped prefill (fixed + a p + a2 p^2, sdplan.derive.fitting.fit_prefill) within 15% of AIConfigurator's
    own prefill from 128 to 32,768 prompt tokens: a line through the same prices is 43% and 57% low at 32,768."""
    _aic()
    from sdplan.calibration.records import StepModel
    from sdplan.derive import DeriveRequest, Models, Pricer, load_aic

    steps = resolve_calibration(name).records.costs
    assert isinstance(steps, StepModel)
    prefill = steps.prefill
    assert prefill.per_prompt_token_sq_s > 0.0
    request = DeriveRequest(target_model=target, system="h100_sxm", method="draft_model", draft_model=draft)
    models = Models()
    try:
        pricer = Pricer(load_aic(), request, models)
        for tokens in (128, 1024, 8192, 32768):
            ours = prefill.fixed_s + tokens * prefill.per_prompt_token_s + tokens**2 * prefill.per_prompt_token_sq_s
            assert ours == pytest.approx(pricer.prefill(tokens), rel=0.15), tokens
    finally:
        models.close()


def test_a_verification_costs_at_least_the_decode_step_it_extends() -> None:
    """More rows never cost less: TensorRT-LLM's MLA op for DeepSeek-R1 at fp8 on 8 H200s is not monotone in its
    rows (32 sequences at context 1 cost more than 64), which priced a 2-token verification at -33 ms."""
    _aic()
    from sdplan.derive import DeriveRequest, Models, Pricer, load_aic

    request = DeriveRequest(target_model="deepseek-ai/DeepSeek-R1", system="h200_sxm", method="ngram",
                            backend="trtllm", tensor_parallel_size=8, precision="fp8", draft_lengths=(1,))
    models = Models()
    try:
        pricer = Pricer(load_aic(), request, models)
        for batch in (8, 32, 64):
            for context in (256, 4096):
                assert pricer.verify(batch, 2, context) >= pricer.verify(batch, 1, context) > 0.0, (batch, context)
    finally:
        models.close()


def drifted(shipped: Path, derived: Path) -> list[str]:
    """The ``*_derived.toml`` names that differ between two folders: missing on either side, or other bytes."""
    names = {path.name for path in shipped.glob("*_derived.toml")} | {path.name for path in derived.glob("*.toml")}
    return sorted(name for name in names if not (shipped / name).is_file() or not (derived / name).is_file()
                  or (shipped / name).read_bytes() != (derived / name).read_bytes())


def test_derivation_reproduces_every_shipped_file_byte_for_byte(tmp_path: Path) -> None:
    """Every shipped ``calibrations/*_derived.toml`` is what ``scripts/derive_shipped.py`` writes today (6 s)."""
    _aic()
    derived = tmp_path / "derived"
    done = subprocess.run([sys.executable, str(REPO / "scripts" / "derive_shipped.py"), "--out", str(derived)],
                          capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    shipped = REPO / "calibrations"
    assert len(list(derived.glob("*.toml"))) == len(list(shipped.glob("*_derived.toml"))) >= 22
    assert drifted(shipped, derived) == [], "drifted: rerun python scripts/derive_shipped.py"
    # the comparison sees one byte changed in any file, and a file the script no longer writes
    copy = tmp_path / "copy"
    copy.mkdir()
    for path in shipped.glob("*_derived.toml"):
        (copy / path.name).write_bytes(path.read_bytes())
    victim = copy / ANCHORED_FILE
    data = bytearray(victim.read_bytes())
    data[len(data) // 2] ^= 0x01
    victim.write_bytes(bytes(data))
    (copy / "retired_derived.toml").write_text("")
    assert drifted(copy, derived) == [ANCHORED_FILE, "retired_derived.toml"]


def test_cli_derive_writes_a_valid_file_and_reports_its_origin(sdplan, tmp_path: Path) -> None:
    _aic()
    out = tmp_path / "ngram.toml"
    result = sdplan("derive", "--target-model", "meta-llama/Llama-3.1-8B-Instruct", "--system", "h100_sxm",
                    "--method", "ngram", "--draft-lengths", "1-3", "--date", "2026-11-25", "-o", str(out),
                    "-f", "json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    cal = load_calibration(out)
    assert cal.method == "derived" and cal.name == "ngram" and report["name"] == "ngram"
    derivation = cal.document["derivation"]
    assert derivation["package"] == "aiconfigurator-core" and derivation["database_version"] == "0.24.0"
    assert derivation["draft_lengths"] == [1.0, 2.0, 3.0]
    assert derivation["max_num_seqs"] == 1024  # no --max-num-seqs: what vllm serve runs with on an H100
    # the fitted form is checked against the curve it was fitted to, and the file says how far it is off
    assert 0 < derivation["target_mean_error_pct"] <= derivation["target_max_error_pct"] < 50
    assert "anchor_rows" not in derivation and derivation["anchor"].startswith("none")  # no BF16 H100 rows
    assert report["origin"]["measured"].startswith("nothing end to end")
    assert any("n-gram" in item for item in report["origin"]["assumed"])
    shown = sdplan("show", "-c", str(out), "--ascii")
    assert shown.exit_code == 0 and "Measured, derived, assumed" in shown.stdout and "aiconfigurator-core" in \
        shown.stdout


def test_cli_derive_runs_a_draft_on_its_own_gpus(sdplan, tmp_path: Path) -> None:
    """--draft-tp: a 1B draft beside a 70B target at TP4 runs on one GPU; more GPUs than the target's is refused."""
    _aic()
    arguments = ["derive", "--target-model", "meta-llama/Llama-3.1-70B-Instruct", "--system", "h100_sxm", "--tp", "4",
                 "--method", "draft_model", "--draft-model", "meta-llama/Llama-3.2-1B-Instruct", "--draft-lengths",
                 "1-2", "--no-anchor", "--date", "2026-11-25"]
    out = tmp_path / "own-tp.toml"
    result = sdplan(*arguments, "--draft-tp", "1", "-o", str(out))
    assert result.exit_code == 0, result.output
    assumptions = " ".join(load_calibration(out).document["provenance"]["assumptions"])
    assert "the draft model runs on 1 of the target's 4 GPUs" in assumptions
    shared = tmp_path / "shared-tp.toml"
    assert sdplan(*arguments, "-o", str(shared)).exit_code == 0
    # the same draft priced on one GPU costs more per step than split over four
    own, split = (load_calibration(path).document["step_model"]["draft"]["fixed_s"] for path in (out, shared))
    assert own > split
    assert load_calibration(out).document["derivation"]["draft_tensor_parallel_size"] == 1
    assert load_calibration(shared).document["derivation"]["draft_tensor_parallel_size"] == 4
    exported = json.loads(sdplan("capacity", "-c", str(out), "--acceptance", "0.8", "-f", "vllm-config").stdout)
    assert exported["draft_tensor_parallel_size"] == 1  # vLLM runs it as priced, not on the target's 4
    # more GPUs than the target's, or a count vLLM's SpeculativeConfig refuses (only 1 or the target's)
    for gpus in ("8", "2"):
        refused = sdplan(*arguments, "--draft-tp", gpus, "-o", str(tmp_path / "x.toml"))
        assert refused.exit_code == ExitStatus.USAGE and f"--draft-tp {gpus}" in refused.stderr
        assert len(refused.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "x.toml").exists()


def test_a_draft_runs_at_its_own_checkpoints_precision(sdplan, tmp_path: Path) -> None:
    """vLLM loads a draft at its checkpoint's precision, not the target's --quantization: an EAGLE-3 head beside
    an fp8 70B target is priced at bf16 unless --draft-precision says otherwise, and costs more per step so;
    MTP layers are the target's (a --draft-precision for them is a usage error)."""
    _aic()
    arguments = ["derive", "--target-model", "meta-llama/Llama-3.1-70B-Instruct", "--system", "h200_sxm", "--tp", "2",
                 "--precision", "fp8", "--method", "eagle3", "--draft-model", "yuhuili/EAGLE3-LLaMA3.3-Instruct-70B",
                 "--draft-lengths", "1-2", "--no-anchor", "--date", "2026-11-25"]
    own, asked = tmp_path / "own.toml", tmp_path / "fp8.toml"
    assert sdplan(*arguments, "-o", str(own)).exit_code == 0
    assert sdplan(*arguments, "--draft-precision", "fp8", "-o", str(asked)).exit_code == 0
    head, quantised = (load_calibration(path).document for path in (own, asked))
    assert head["derivation"]["draft_precision"] == "bf16" and quantised["derivation"]["draft_precision"] == "fp8"
    assert "at bf16 (vLLM loads a draft at its own checkpoint's precision" in " ".join(
        head["provenance"]["assumptions"])
    assert head["step_model"]["draft"]["fixed_s"] > 1.2 * quantised["step_model"]["draft"]["fixed_s"]
    # the bf16 head's weights leave less of the GPUs to the KV cache
    assert head["derivation"]["kv_cache_tokens"] < quantised["derivation"]["kv_cache_tokens"]
    mtp = sdplan("derive", "--target-model", "deepseek-ai/DeepSeek-V3", "--system", "h200_sxm", "--tp", "8",
                 "--method", "mtp", "--precision", "fp8_block", "--draft-precision", "bf16",
                 "-o", str(tmp_path / "m.toml"))
    assert mtp.exit_code == ExitStatus.USAGE and "--draft-precision" in mtp.stderr
    assert len(mtp.stderr.strip().splitlines()) == 1


def test_a_pair_the_database_lacks_is_a_one_line_error(sdplan, tmp_path: Path) -> None:
    _aic()
    result = sdplan("derive", "--target-model", "meta-llama/Llama-3.1-8B-Instruct", "--system", "a100_sxm",
                    "--method", "draft_model", "--draft-model", "meta-llama/Llama-3.2-1B-Instruct",
                    "-o", str(tmp_path / "x.toml"))
    assert result.exit_code == ExitStatus.USAGE
    *progress, error = result.stderr.strip().splitlines()  # progress lines, then the error on one line
    assert error.startswith("Error: AIConfigurator 0.12.0 cannot price") and "head_size: 64" in error
    assert all(not line.startswith("Error") for line in progress)
    assert not (tmp_path / "x.toml").exists()


def test_without_the_package_derive_exits_5_naming_the_install_line(tmp_path: Path) -> None:
    hidden = tmp_path / "hide"
    (hidden / "aiconfigurator_core").mkdir(parents=True)
    (hidden / "aiconfigurator_core" / "__init__.py").write_text("raise ImportError('hidden by the test')\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(hidden), str(REPO), os.environ.get("PYTHONPATH", "")]))
    done = subprocess.run([sys.executable, "-m", "sdplan", "derive", "--target-model", "Qwen/Qwen3-32B",
                           "--system", "h100_sxm", "--method", "ngram", "-o", str(tmp_path / "x.toml")],
                          capture_output=True, text=True, env=env, check=False)
    assert done.returncode == ExitStatus.MISSING_DEPENDENCY, done.stderr
    assert "pip install aiconfigurator-core==0.12.0" in done.stderr and "Traceback" not in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and not (tmp_path / "x.toml").exists()


def test_a_request_is_priced_for_the_engines_own_batch_cap_unless_given() -> None:
    from sdplan.derive import DeriveRequest

    def cap(**given) -> int:
        return DeriveRequest(target_model="m", system=given.pop("system", "h100_sxm"), method="ngram",
                             **given).batch_cap

    assert cap() == cap(system="b200_sxm") == 1024  # vLLM on GPUs of 70 GiB or more
    assert cap(system="l40s") == cap(system="a100_sxm") == 256
    assert cap(backend="sglang") == 2048 and cap(backend="trtllm") == 256
    assert cap(max_num_seqs=48) == cap(max_num_seqs=48, backend="sglang") == 48


def test_a_request_without_its_draft_is_a_usage_error(sdplan, tmp_path: Path) -> None:
    result = sdplan("derive", "--target-model", "Qwen/Qwen3-32B", "--system", "h100_sxm", "--method", "eagle3",
                    "-o", str(tmp_path / "x.toml"))
    assert result.exit_code == ExitStatus.USAGE and "--draft-model" in result.stderr


def test_shipped_derived_files_say_what_they_rest_on() -> None:
    derived = [load_calibration(path) for path in shipped_calibrations() if path.stem.endswith("_derived")]
    assert len(derived) >= 20
    for cal in derived:
        derivation = cal.document["derivation"]
        assert cal.method == "derived" and cal.provenance["assumptions"]
        assert derivation["licence"] == "Apache-2.0" and derivation["package_version"]
        origin = cal.origin()
        assert origin["assumed"] and any("aiconfigurator-core" in item for item in origin["versions"])
        if "anchor_rows" in derivation:  # anchoring brings the no-SD part to the measured rows
            assert derivation["anchor_anchored_mape_pct"] < derivation["anchor_gap_mape_pct"]
            assert "silicon_sample.csv" in origin["measured"]
    anchored = resolve_calibration(ANCHORED).document["derivation"]
    assert anchored["anchor_rows"] >= 20


def test_every_derived_file_prices_the_engines_prefill_overhead_per_target_layer() -> None:
    """A derived file's prefill overhead is its target's layers times the fitted value, and says so."""
    from sdplan.derive.request import PREFILL_OVERHEAD_PER_LAYER_S

    derived = [load_calibration(path) for path in shipped_calibrations() if path.stem.endswith("_derived")]
    layers = {cal.name: cal.document["derivation"]["target_layers"] for cal in derived}
    assert layers["h100-sxm_llama-3.1-8b_ngram_derived"] == 32 and layers["8xh200_deepseek-v3_mtp_derived"] == 61
    for cal in derived:
        overhead = cal.document["step_model"]["engine"]["prefill_overhead_s"]
        assert overhead == pytest.approx(layers[cal.name] * PREFILL_OVERHEAD_PER_LAYER_S, rel=1e-5)
        assert any("per target layer" in item for item in cal.provenance["assumptions"])


def test_a_benchmark_can_price_another_prefill_overhead() -> None:
    """The per-layer value is the request's to set (a benchmark scores a model with one fitted without it)."""
    _aic()
    from dataclasses import replace

    from sdplan.derive import DeriveRequest, derive

    request = DeriveRequest(target_model="meta-llama/Llama-3.1-8B-Instruct", system="h100_sxm", method="ngram",
                            draft_lengths=(1,), anchor=False)
    shipped = derive(request).document
    other = derive(replace(request, prefill_overhead_per_layer_s=1e-3)).document
    assert shipped["step_model"]["engine"]["prefill_overhead_s"] == pytest.approx(32 * 0.60e-3)
    assert other["step_model"]["engine"]["prefill_overhead_s"] == pytest.approx(32 * 1e-3)
    assert shipped["step_model"]["prefill"] == other["step_model"]["prefill"]


def test_a_derived_file_must_say_how(direct_document) -> None:
    direct_document["provenance"] |= {"method": "derived", "assumptions": ["priced"]}
    with pytest.raises(InputFileError, match="derivation"):
        parse_calibration(direct_document, "x.toml")
    direct_document["provenance"]["assumptions"] = []
    with pytest.raises(InputFileError, match="assumptions"):
        parse_calibration(direct_document, "x.toml")


def test_every_method_reports_its_origin(direct_document) -> None:
    fit = parse_calibration(direct_document, "x.toml").origin()
    assert "benchmark runs" in fit["measured"] and "fitted" in fit["derived"]
    assert fit["assumed"] == ["acceptance is not part of this file: given per workload"]
    roofline = resolve_calibration("a100-sxm-80gb_llama-3.1-8b_llama-3.2-1b_roofline")
    assert roofline.origin()["measured"] == "nothing" and "cannot build" in roofline.provenance["notes"]


def test_a_model_aiconfigurator_lacks_is_refused_offline(sdplan, tmp_path: Path) -> None:
    """A name without a shipped config would make AIConfigurator download it; derive refuses instead."""
    _aic()
    result = sdplan("derive", "--target-model", "example-org/not-a-model", "--system", "h100_sxm", "--method",
                    "ngram", "-o", str(tmp_path / "x.toml"))
    assert result.exit_code == ExitStatus.USAGE
    assert "ships no config.json" in result.stderr and "HuggingFace" not in result.stderr


@pytest.mark.parametrize(("target", "draft", "said"), [
    ("meta-llama/Meta-Llama-3.1-8B-Instruct", "meta-llama/Llama-3.2-3B-Instruct",
     "priced with AIConfigurator's meta-llama/Meta-Llama-3.1-8B"),
    ("Qwen/Qwen3-14B", "Qwen/Qwen3-4B", "Qwen/Qwen3-4B is not in AIConfigurator's model set"),
    ("meta-llama/Llama-3.1-8B-Instruct", "meta-llama/Llama-3.2-1B", "meta-llama/Llama-3.2-1B is not in"),
])
def test_common_targets_and_drafts_are_priced_offline_and_say_from_what(sdplan, tmp_path: Path, target: str,
                                                                         draft: str, said: str) -> None:
    """The names benchmarks give (Meta-Llama-3.1 Instruct, Llama 3.2 1B/3B and Qwen3-4B drafts) are priced
    from AIConfigurator's architecture or sdplan's own config.json table, without a download."""
    _aic()
    out = tmp_path / "x.toml"
    result = sdplan("derive", "--target-model", target, "--system", "h100_sxm", "--method", "draft_model",
                    "--draft-model", draft, "--draft-lengths", "1", "--no-anchor", "-o", str(out))
    assert result.exit_code == 0, result.output
    assert any(said in line for line in load_calibration(out).document["provenance"]["assumptions"])


def test_a_draft_that_leaves_no_kv_cache_is_a_one_line_error(sdplan, tmp_path: Path) -> None:
    """Qwen3-32B in bf16 (64 GB) and Qwen3-4B (8 GB) on one H100: nothing is left for the KV cache with SD on."""
    _aic()
    result = sdplan("derive", "--target-model", "Qwen/Qwen3-32B", "--system", "h100_sxm", "--method", "draft_model",
                    "--draft-model", "Qwen/Qwen3-4B", "--draft-lengths", "1", "--no-anchor",
                    "-o", str(tmp_path / "x.toml"))
    assert result.exit_code == ExitStatus.USAGE and not (tmp_path / "x.toml").exists()
    assert "leaves no KV cache on 1x h100_sxm at bf16" in result.stderr and "raise --tp" in result.stderr
    assert "Traceback" not in result.stderr


def test_mtp_is_refused_for_a_target_without_mtp_layers(sdplan, tmp_path: Path) -> None:
    """MTP drafts with the target's own layers: a config.json that declares none (Qwen3-8B, Kimi-K2.5) has nothing
    to serve it with; one that does, at the top level (DeepSeek-V3) or in its text_config (Qwen3.5), is priced."""
    _aic()
    from sdplan.derive.pricing import has_mtp_layers, model_config_json

    result = sdplan("derive", "--target-model", "Qwen/Qwen3-8B", "--system", "h100_sxm", "--method", "mtp",
                    "-o", str(tmp_path / "x.toml"))
    assert result.exit_code == ExitStatus.USAGE and not (tmp_path / "x.toml").exists()
    assert "declares no MTP layers" in result.stderr and "--method eagle3" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    assert [has_mtp_layers(model_config_json(name) or {}) for name in
            ("deepseek-ai/DeepSeek-V3", "Qwen/Qwen3.5-27B", "moonshotai/Kimi-K2.5", "Qwen/Qwen3-8B")] == \
        [True, True, False, False]
    folder = tmp_path / "mine"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"text_config": {"mtp_num_hidden_layers": 1}}))
    assert has_mtp_layers(model_config_json(str(folder)) or {})


def test_anchoring_reads_the_rows_sdplan_fit_reads_and_only_the_rows_given() -> None:
    """derive anchors on sdplan.runs.silicon's rows of its configuration, or on the rows it is given."""
    _aic()
    from sdplan.derive import DeriveRequest, MeasuredRows, derive, measured_rows
    from sdplan.runs import silicon

    request = DeriveRequest(target_model="Qwen/Qwen3-32B", system="h100_sxm", method="ngram",
                            tensor_parallel_size=2, draft_lengths=(1,))
    found = measured_rows(request)
    path = silicon.resolve_path(silicon.PACKAGED)
    selection = silicon.Selection.parse(["model=Qwen3-32B,system=h100_sxm,backend=vllm,tp=2,precision=unrecorded"])
    selected, _, _ = silicon.read_silicon(str(path), path.read_text(encoding="utf-8"), selection)
    assert sorted(run.source for run in found.runs) == sorted(run.source for run in selected)
    assert set(found.versions) == {"0.12.0"}
    whole = derive(request)
    assert whole.anchor is not None and whole.anchor["rows"] + whole.anchor["rows_left_out"] == len(found.runs)
    low = [(run, version) for run, version in zip(found.runs, found.versions) if run.concurrency <= 32]
    part = derive(request, measured=MeasuredRows(tuple(r for r, _ in low), tuple(v for _, v in low)))
    assert part.anchor is not None and part.anchor["rows"] <= len(low) < whole.anchor["rows"]
    assert part.anchor["concurrency"][1] <= 32 and part.anchor["decode_scale"] != whole.anchor["decode_scale"]
    too_few = derive(request, measured=MeasuredRows(found.runs[:2], found.versions[:2]))
    assert too_few.anchor is None and too_few.document["derivation"]["anchor"].startswith("none")


def test_every_alias_names_a_model_aiconfigurator_ships() -> None:
    _aic()
    from aiconfigurator_core.sdk.common import DefaultHFModels

    from sdplan.derive import MODEL_ALIASES

    assert "meta-llama/Llama-3.1-405B-Instruct" in MODEL_ALIASES
    assert all(known in DefaultHFModels for known in MODEL_ALIASES.values())


def test_a_config_aiconfigurator_ships_but_no_longer_lists_is_read_offline(sdplan, tmp_path: Path) -> None:
    """Mixtral-8x7B: its config.json is in the package's model_configs, but not in DefaultHFModels."""
    _aic()
    from aiconfigurator_core.sdk.common import DefaultHFModels

    assert "mistralai/Mixtral-8x7B-v0.1" not in DefaultHFModels
    out = tmp_path / "mixtral.toml"
    result = sdplan("derive", "--target-model", "mistralai/Mixtral-8x7B-v0.1", "--system", "h100_sxm", "--tp", "2",
                    "--method", "ngram", "--draft-lengths", "1", "-o", str(out), "--format", "json")
    assert result.exit_code == 0, result.stderr
    text = out.read_text()
    assert "[moe]" in text and "mistralai/Mixtral-8x7B-v0.1" in text


def test_a_tensor_parallelism_the_heads_do_not_divide_is_a_one_line_error(sdplan, tmp_path: Path) -> None:
    """AIConfigurator asserts that the heads divide over the GPUs; that is bad input, not an internal error."""
    _aic()
    result = sdplan("derive", "--target-model", "meta-llama/Llama-3.1-8B-Instruct", "--system", "h100_sxm",
                    "--tp", "3", "--method", "ngram", "-o", str(tmp_path / "x.toml"))
    assert result.exit_code == ExitStatus.USAGE
    error = result.stderr.strip().splitlines()[-1]
    assert error.startswith("Error: AIConfigurator 0.12.0 cannot price") and "divisible by tp_size 3" in error
    assert error.endswith("choose another --tensor-parallel-size or --precision")
    assert "Traceback" not in result.stderr and not (tmp_path / "x.toml").exists()


def test_a_model_database_gap_gets_no_layout_hint() -> None:
    assert layout_hint("context MLA data missing") == ""
    assert layout_hint("(moe_intermediate_size=1536 / moe_tp_size=8) % weight_block_size=128 != 0").startswith(
        "; the model does not split so over the GPUs")


def test_an_anchor_leaves_out_rows_whose_requests_waited_for_admission() -> None:
    """gpt-oss-120b on 2x H100: one of its rows (512 clients, 1024/1024, engine version unrecorded) has a TTFT of
    23.8 s and a TPOT (5.6 ms) below that of 64 clients (14.8 ms): far fewer than 512 ran a step. Fitted on, it
    pulled the anchor to a decode scale of 0.36 and no prefill at all (MAPE 56% after anchoring); left out, the
    anchor fits its rows within 10% and keeps a prefill cost."""
    _aic()
    from sdplan.derive import DeriveRequest, derive, measured_rows
    from sdplan.runs import silicon

    request = DeriveRequest(target_model="openai/gpt-oss-120b", system="h100_sxm", method="ngram",
                            tensor_parallel_size=2, draft_lengths=(1,))
    found = measured_rows(request, {"moe_quant_mode": "w4a16_mxfp4"})
    waited = [run for run, queued in zip(found.runs, silicon.waited_for_admission(found.runs)) if queued]
    assert any(run.concurrency == 512 and run.mean_ttft_s > 20 for run in waited)
    anchor = derive(request).anchor
    assert anchor is not None and anchor["concurrency"][1] < 512
    assert anchor["anchored_mape_pct"] < 10 and anchor["prefill_scale"] > 0.5 and anchor["decode_scale"] > 0.5


def test_an_sglang_file_says_sglang_runs_48_requests_under_sd() -> None:
    """The file says what the planner applies: SGLang's 48 running requests under SD; a vLLM file says nothing."""
    _aic()
    from sdplan.derive import DeriveRequest, derive

    request = DeriveRequest(target_model="meta-llama/Llama-3.1-8B-Instruct", system="h100_sxm", method="eagle3",
                            draft_model="yuhuili/EAGLE3-LLaMA3.1-Instruct-8B", backend="sglang", draft_lengths=(1,),
                            anchor=False)
    sglang = derive(request).document["provenance"]["assumptions"]
    assert any(item.startswith("SGLang runs at most 48 requests at once under SD") for item in sglang)
    vllm = derive(DeriveRequest(target_model="meta-llama/Llama-3.1-8B-Instruct", system="h100_sxm", method="ngram",
                                draft_lengths=(1,), anchor=False)).document["provenance"]["assumptions"]
    assert not any("requests at once under SD" in item for item in vllm)


def test_each_engine_sizes_its_kv_cache_from_its_own_default_share(sdplan, tmp_path: Path) -> None:
    """TensorRT-LLM sizes its KV cache from 0.9 of the memory free after the weights (free_gpu_memory_fraction),
    vLLM from 0.9 of the whole GPU: AIConfigurator refuses the vLLM budget for trtllm, and the derived file had
    no KV cache at all ("KV cache unknown"), so no cap. Now it records AIConfigurator's own count for TensorRT-LLM's
    budget, which holds more than vLLM's whenever the weights take memory: 0.9 (M - W) > 0.9 M - W. SGLang keeps
    a reserve of at least 10 GiB on an 80 GB GPU (mem_fraction_static 0.836 on one H100), so less than vLLM."""
    _aic()
    from aiconfigurator_core.sdk.backends.sglang_backend import derive_sglang_mem_fraction_static
    from aiconfigurator_core.sdk.memory import estimate_kv_cache

    arguments = ["derive", "--target-model", "meta-llama/Llama-3.1-8B-Instruct", "--system", "h100_sxm",
                 "--method", "eagle3", "--draft-model", "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B", "--draft-lengths", "1",
                 "--no-anchor", "--date", "2026-12-01"]
    caches = {}
    for backend in ("trtllm", "vllm", "sglang"):
        out = tmp_path / f"{backend}.toml"
        result = sdplan(*arguments, "--backend", backend, "-o", str(out))
        assert result.exit_code == 0, result.output
        assert "KV cache unknown" not in result.stderr
        caches[backend] = load_calibration(out).document["derivation"]
    trt, vllm = caches["trtllm"], caches["vllm"]
    assert trt["kv_cache_tokens"] < trt["kv_cache_tokens_without_draft"]  # the head's weights and KV take some
    assert trt["kv_cache_tokens_without_draft"] > vllm["kv_cache_tokens_without_draft"]
    assert caches["sglang"]["kv_cache_tokens_without_draft"] < 0.93 * vllm["kv_cache_tokens_without_draft"]
    from sdplan.derive import DeriveRequest, Models, Pricer, load_aic

    models = Models()
    try:
        request = DeriveRequest(target_model="meta-llama/Llama-3.1-8B-Instruct", system="h100_sxm", method="ngram",
                                backend="trtllm")
        path = Pricer(load_aic(), request, models).target_path  # the config.json AIConfigurator ships, offline
        own = estimate_kv_cache(path, "h100_sxm", "trtllm", trt["database_version"], max_num_tokens=8192,
                                max_batch_size=256, memory_fraction_kind="of_free", memory_fraction_value=0.9,
                                tp_size=1, moe_tp_size=1, moe_ep_size=1, gemm_quant_mode="bfloat16")
        sglang = caches["sglang"]
        share = derive_sglang_mem_fraction_static(80 * 1024**3, tp_size=1)  # h100_sxm's 80 GiB
        assert share == pytest.approx(0.836)
        theirs = estimate_kv_cache(path, "h100_sxm", "sglang", sglang["database_version"], max_num_tokens=8192,
                                   max_batch_size=2048, memory_fraction_kind="of_total", memory_fraction_value=share,
                                   tp_size=1, moe_tp_size=1, moe_ep_size=1, gemm_quant_mode="bfloat16")
    finally:
        models.close()
    assert trt["kv_cache_tokens_without_draft"] == pytest.approx(own["total_kv_size_tokens"], rel=1e-6)
    assert sglang["kv_cache_tokens_without_draft"] == pytest.approx(theirs["total_kv_size_tokens"], rel=1e-6)
    # TensorRT-LLM reserves a request's whole prompt and output at admission (GUARANTEED_NO_EVICT)
    plan = sdplan("plan", "-c", str(tmp_path / "trtllm.toml"), "--acceptance", "0.7", "--prompt-tokens", "4096",
                  "--output-tokens", "2048")
    held = trt["kv_cache_tokens_without_draft"] // (4096 + 2048)
    assert plan.exit_code == 0 and f"batch cap of {held} sequences: KV cache of" in " ".join(plan.stdout.split())


KNOWN = {"meta-llama/Meta-Llama-3.1-8B", "meta-llama/Llama-3.1-8B-Instruct", "Qwen/Qwen3-8B", "Qwen/Qwen3-4B",
         "Qwen/Qwen3-30B-A3B", "Qwen/Qwen3-235B-A22B", "Qwen/Qwen3-235B-A22B-FP8", "deepseek-ai/DeepSeek-R1",
         "nvidia/Llama-3.1-70B-Instruct-FP8", "org-a/Twin-7B", "org-b/Twin-7B"}


@pytest.mark.parametrize(("name", "precision", "priced", "says"), [
    ("meta-llama/Llama-3.1-8B-Instruct", None, "meta-llama/Meta-Llama-3.1-8B", "same architecture"),
    ("Qwen/Qwen3-8B", None, "Qwen/Qwen3-8B", None),
    ("qwen/qwen3-8b", None, "Qwen/Qwen3-8B", "up to case"),
    ("Llama-3.1-8B-Instruct", None, "meta-llama/Meta-Llama-3.1-8B", "organisation"),
    ("deepseek-ai/DeepSeek-R1-0528", None, "deepseek-ai/DeepSeek-R1", "dated re-release"),
    ("Qwen/Qwen3-30B-A3B-Instruct-2507", None, "Qwen/Qwen3-30B-A3B", "dated re-release"),
    ("Qwen/Qwen3-4B-Thinking-2507", None, "Qwen/Qwen3-4B", "dated re-release"),
    ("Qwen/Qwen3-235B-A22B-Instruct-2507-FP8", "fp8_block", "Qwen/Qwen3-235B-A22B-FP8", "dated re-release"),
    ("RedHatAI/Llama-3.1-8B-Instruct-FP8", "fp8", "meta-llama/Meta-Llama-3.1-8B", "its name says FP8 weights"),
    ("RedHatAI/Llama-3.1-8B-Instruct-FP8-dynamic", "fp8", "meta-llama/Meta-Llama-3.1-8B", "FP8-DYNAMIC"),
    ("nvidia/Llama-3.1-70B-Instruct-FP8", "fp8", "nvidia/Llama-3.1-70B-Instruct-FP8", None),
])
def test_a_model_name_is_priced_under_the_name_of_its_architecture(name: str, precision: str | None, priced: str,
                                                                   says: str | None) -> None:
    """Benchmarks and papers name models as Hugging Face lists them today: without the organisation, in other
    case, as a dated re-release (-2507, -0528) or as someone's quantised checkpoint (-FP8). Each is priced with
    the architecture derive has a config for, and the file's assumptions say so."""
    from sdplan.derive.request import resolve_model_name

    resolved = resolve_model_name(name, KNOWN, precision)
    assert resolved is not None and resolved.name == priced
    assert (resolved.note is None) if says is None else (says in str(resolved.note) and name in str(resolved.note))


def test_a_name_no_rule_can_place_is_not_guessed_and_a_quantised_name_needs_its_precision() -> None:
    from sdplan.derive.request import resolve_model_name

    assert resolve_model_name("Twin-7B", KNOWN) is None  # two organisations have a Twin-7B: not guessed
    assert resolve_model_name("Qwen3", KNOWN) is None and resolve_model_name("acme/Model-7B-FP8", KNOWN) is None
    with pytest.raises(InvalidValueError, match=r"its name says FP8 weights.*give --draft-precision fp8 to price "
                                                r"it as meta-llama/Meta-Llama-3\.1-8B at fp8"):
        resolve_model_name("RedHatAI/Llama-3.1-8B-Instruct-FP8", KNOWN, "bf16", "--draft-precision")


def test_derive_prices_a_model_name_without_its_organisation_as_the_named_one(sdplan, tmp_path: Path) -> None:
    """"Llama-3.1-8B-Instruct" (a benchmark's name for it) derives the file "meta-llama/Llama-3.1-8B-Instruct"
    derives, but for the name and the assumption that says how it was matched; an -FP8 checkpoint's name at the
    default bf16 is a one-line usage error naming the --precision to give, and no file is written."""
    _aic()
    arguments = ["derive", "--system", "h100_sxm", "--method", "ngram", "--draft-lengths", "1", "--no-anchor",
                 "--date", "2026-12-01", "--name", "x"]
    for name, out in (("meta-llama/Llama-3.1-8B-Instruct", "full.toml"), ("Llama-3.1-8B-Instruct", "short.toml")):
        done = sdplan(*arguments, "--target-model", name, "-o", str(tmp_path / out))
        assert done.exit_code == 0, done.output
    full, short = (load_calibration(tmp_path / out).document for out in ("full.toml", "short.toml"))
    assert full["step_model"] == short["step_model"] and full["derivation"] == short["derivation"]
    assert ("Llama-3.1-8B-Instruct is priced as meta-llama/Meta-Llama-3.1-8B (the same model name up to case and "
            "organisation)") in short["provenance"]["assumptions"]
    refused = sdplan(*arguments, "--target-model", "RedHatAI/Llama-3.1-8B-Instruct-FP8",
                     "-o", str(tmp_path / "fp8.toml"))
    assert refused.exit_code == ExitStatus.USAGE and "give --precision fp8" in refused.stderr
    assert len(refused.stderr.strip().splitlines()) == 1 and not (tmp_path / "fp8.toml").exists()
