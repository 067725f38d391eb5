"""``sdplan calibrations`` and ``sdplan show``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sdplan.calibration import DEFAULT_CALIBRATION, shipped_calibrations
from sdplan.errors import ExitStatus

DATA = Path(__file__).resolve().parent / "data"


def test_calibrations_lists_every_shipped_file(sdplan) -> None:
    result = sdplan("calibrations")
    assert result.exit_code == 0, result.output
    for path in shipped_calibrations():
        assert path.stem in result.stdout
    assert f"{DEFAULT_CALIBRATION}*" in result.stdout


def test_calibrations_json(sdplan, tmp_path: Path) -> None:
    out = tmp_path / "list.json"
    result = sdplan("calibrations", "--format", "json", "--output", str(out), "--ascii")
    assert result.exit_code == 0
    doc = json.loads(out.read_text())
    assert doc["schema_version"] == 1
    items = doc["calibrations"]
    assert len(items) == len(shipped_calibrations())
    assert all(item["valid"] for item in items)
    assert sum(item["default"] for item in items) == 1
    assert all(item["provenance"]["method"] in ("measured", "fit", "roofline", "derived") for item in items)
    for item in items:  # each file says what was measured, derived and assumed, with versions
        assert set(item["origin"]) == {"measured", "derived", "assumed", "versions"} and item["origin"]["versions"]


def test_show_valid_calibration(sdplan) -> None:
    result = sdplan("show", "-c", DEFAULT_CALIBRATION, "--ascii")
    assert result.exit_code == 0, result.output
    assert "valid" in result.stdout and "c2v_s" in result.stdout and "assumptions" in result.stdout


def test_show_prints_a_files_words_as_written(sdplan, write_calibration, direct_document) -> None:
    """Square brackets in a file's text are its words, not terminal markup: the shipped files name the
    "[derivation] anchor" table, and a note may hold anything."""
    shipped = sdplan("show", "-c", DEFAULT_CALIBRATION, "--ascii")
    assert shipped.exit_code == 0 and "([derivation] anchor)" in shipped.stdout.replace("\n", " ")
    direct_document["provenance"]["notes"] = "[bold]kept[/bold] [red]"
    direct_document["description"] = "a [b]file[/b]"
    path = write_calibration(direct_document, "odd[name]")
    result = sdplan("show", "-c", str(path), "--ascii")
    assert result.exit_code == 0, result.output
    assert "[bold]kept[/bold] [red]" in result.stdout and "a [b]file[/b]" in result.stdout
    assert "odd[name]" in result.stdout


def test_show_json_at_another_workload(sdplan) -> None:
    base = json.loads(sdplan("show", "-f", "json").stdout)
    longer = json.loads(sdplan("show", "-f", "json", "--prompt-tokens", "4096", "--output-tokens", "1024").stdout)
    assert longer["coefficients_at_workload"]["prompt_tokens"] == 4096
    assert longer["coefficients_at_workload"]["c2v_s"] > base["coefficients_at_workload"]["c2v_s"]
    assert base["document"]["provenance"]["date"] == "2026-11-25"


def test_show_invalid_file_exits_3_naming_the_key(sdplan, write_calibration, direct_document) -> None:
    direct_document["coefficients"]["speculative"]["c1v_s"] = -1.0
    path = write_calibration(direct_document)
    result = sdplan("show", "-c", str(path))
    assert result.exit_code == ExitStatus.BAD_INPUT
    assert f"{path}: coefficients.speculative.c1v_s: must be >= 0" in result.stderr
    assert "Traceback" not in result.output


def test_show_rejects_bad_lengths(sdplan) -> None:
    assert sdplan("show", "--prompt-tokens", "0").exit_code == ExitStatus.USAGE


def test_every_answer_names_a_bracketed_calibration_as_written(sdplan, write_calibration, direct_document) -> None:
    """A calibration's name is the file's word: plan, check and capacity print it verbatim."""
    direct_document["name"] = "box[v2]"
    path = str(write_calibration(direct_document, "box"))
    for command in (["plan"], ["check", "--rate", "1", "--slo", "e2e:mean<=60s"],
                    ["capacity", "--slo", "e2e:mean<=60s"]):
        result = sdplan(*command, "-c", path, "--ascii")
        assert result.exit_code == 0, result.output
        assert "calibration box[v2]" in result.stdout, command


def test_show_prices_the_engine_step_at_each_batch(sdplan) -> None:
    """The step the file prices, per batch and draft length: what a GPU's step timings are compared with."""
    from sdplan.calibration import resolve_calibration
    from sdplan.latency.model import step_times

    doc = json.loads(sdplan("show", "-f", "json").stdout)
    steps = doc["step_times_at_workload"]
    assert steps["batch_requests"] == [1, 4, 16, 64, 128, 256]
    assert [o["draft_length_tokens"] for o in steps["options"]] == [0, 1, 2, 3, 4]
    cal = resolve_calibration(DEFAULT_CALIBRATION)
    expected = step_times(cal.coefficients_at(1024, 512), [1, 2, 3, 4], steps["batch_requests"])
    for column, option in enumerate(steps["options"]):
        assert option["step_s"] == list(expected[:, column])
        # more sequences, and more tokens each, never make a step cheaper
        assert all(b >= a for a, b in zip(option["step_s"], option["step_s"][1:]))
    for row in zip(*(o["step_s"] for o in steps["options"])):
        assert all(b > a for a, b in zip(row, row[1:]))
    table = sdplan("show", "--ascii").stdout
    assert "Engine step at 1024 prompt / 512 output tokens (ms)" in table and "B (sequences)" in table


def test_show_says_what_of_each_step_is_the_engines_overhead_beside_its_kernels(sdplan) -> None:
    """Kernel timings hold against the step less the engine's overheads the file prices beside its op timings."""
    from sdplan.calibration import resolve_calibration

    name = "h100-sxm_llama-3.1-8b_ngram_derived"  # its n-gram lookup costs per running sequence too
    steps = resolve_calibration(name).document["step_model"]
    host, cycle = steps["engine"]["step_overhead_s"], steps["speculation"]
    doc = json.loads(sdplan("show", "-c", name, "--batch-sizes", "1,64", "-f", "json").stdout)
    options = doc["step_times_at_workload"]["options"]
    assert options[0]["engine_overhead_s"] == [host, host]
    for option in options[1:]:
        per_cycle, per_sequence = cycle["overhead_fixed_s"], cycle["overhead_per_sequence_s"]
        assert option["engine_overhead_s"] == [host + per_cycle + batch * per_sequence for batch in (1, 64)]
        assert option["engine_overhead_s"][1] > option["engine_overhead_s"][0]
    for option in options:  # the kernels' part of every step is what is left, and it is most of it
        assert all(0 < overhead < 0.5 * step for overhead, step in zip(option["engine_overhead_s"], option["step_s"]))
    table = sdplan("show", "-c", name, "--ascii").stdout
    assert "overhead beside its kernels" in " ".join(table.split())


def test_show_parts_an_sd_cycle_into_the_drafters_steps_and_the_verification(sdplan) -> None:
    """A drafter's step timings and a verification step's are held against their own parts of the cycle: the
    drafter's k steps (drafting_s), and what is left less the overheads, which verifies k + 1 rows a sequence and so
    costs at least the decode step's kernels, more once the rows pass the knee. A fitted file, whose drafted token
    and verified row are one cost, gives no split."""
    from sdplan.calibration import resolve_calibration

    name = "h100-sxm_llama-3.1-8b_eagle3_derived"
    draft = resolve_calibration(name).document["step_model"]["draft"]
    doc = json.loads(sdplan("show", "-c", name, "--batch-sizes", "1,64,128", "-k", "1,3", "-f", "json").stdout)
    steps = doc["step_times_at_workload"]
    assert "drafting_s" in steps["drafting_definition"]
    decode, *cycles = steps["options"]
    assert "drafting_s" not in decode
    kernels = [step - overhead for step, overhead in zip(decode["step_s"], decode["engine_overhead_s"])]
    for option in cycles:
        k = option["draft_length_tokens"]
        context = 1024 + 512 / 2
        assert option["drafting_s"] == pytest.approx([k * (draft["fixed_s"] + batch * (
            draft["per_sequence_s"] + draft["per_query_token_s"] + context * draft["per_context_token_s"]))
            for batch in (1, 64, 128)], rel=1e-9)
        verify = [step - drafting - overhead for step, drafting, overhead
                  in zip(option["step_s"], option["drafting_s"], option["engine_overhead_s"])]
        assert verify[0] == pytest.approx(kernels[0], rel=0.01)  # one sequence: bound by memory, as a decode step
        assert all(v >= d for v, d in zip(verify, kernels))
    assert cycles[1]["step_s"][2] - cycles[1]["drafting_s"][2] - cycles[1]["engine_overhead_s"][2] > 1.2 * kernels[2]
    fitted = json.loads(sdplan("show", "-c", str(DATA / "served-passes-cpu" / "served.toml"), "-f", "json").stdout)
    assert fitted["form"] == "direct"
    assert "drafting_definition" not in fitted["step_times_at_workload"]
    assert not any("drafting_s" in option for option in fitted["step_times_at_workload"]["options"])


def test_show_prices_the_step_at_the_batches_and_draft_lengths_asked(sdplan) -> None:
    """A GPU's step timings come at their own batches and draft lengths: --batch-sizes and -k price those."""
    from sdplan.calibration import resolve_calibration
    from sdplan.latency.model import step_times

    doc = json.loads(sdplan("show", "--batch-sizes", "2,32,8", "-k", "5,3", "-f", "json").stdout)
    steps = doc["step_times_at_workload"]
    assert steps["batch_requests"] == [2, 8, 32]
    assert [o["draft_length_tokens"] for o in steps["options"]] == [0, 3, 5]
    expected = step_times(resolve_calibration(DEFAULT_CALIBRATION).coefficients_at(1024, 512), [3, 5], [2, 8, 32])
    for column, option in enumerate(steps["options"]):
        assert option["step_s"] == list(expected[:, column])
    assert [cap["draft_length_tokens"] for cap in doc["batch_caps_at_workload"]] == [0, 3, 5]
    table = sdplan("show", "--batch-sizes", "1-3", "--ascii").stdout
    assert "k=4" in table and "k=5" not in table  # the file's priced draft lengths, up to four
    for bad, says in (("0,4", "a step runs at least 1 sequence"), ("4-2", "empty range"), ("x", "not an integer")):
        result = sdplan("show", "--batch-sizes", bad)
        assert result.exit_code == ExitStatus.USAGE and says in result.output, bad
        assert "Traceback" not in result.output


def test_show_says_how_many_requests_each_engine_holds_and_what_limits_it(sdplan) -> None:
    """No SD has the GPU's memory to itself, SD shares it with its draft: each option's cap at the workload is
    plan's (resolve_limits, no flags), the KV cache binds before vLLM's max_num_seqs of 1024 on an H100."""
    from sdplan.calibration import resolve_calibration

    derivation = resolve_calibration(DEFAULT_CALIBRATION).document["derivation"]
    for prompt, output in ((1024, 512), (8192, 512)):
        doc = json.loads(sdplan("show", "--prompt-tokens", str(prompt), "--output-tokens", str(output),
                                "-f", "json").stdout)
        assert doc["max_num_seqs"]["requests"] == derivation["max_num_seqs"] == 1024
        caps = {cap["draft_length_tokens"]: cap["requests"] for cap in doc["batch_caps_at_workload"]}
        # vLLM fills its cache as requests run: each holds its prompt, half its output and half a 16-token block
        assert caps[0] == derivation["kv_cache_tokens_without_draft"] // (prompt + output / 2 + 8)
        # and k lookahead slots a running SD request, so the longer drafts may hold one request fewer
        assert all(derivation["kv_cache_tokens"] // (prompt + output / 2 + 8 + k) == caps[k] for k in (1, 2, 3, 4))
        assert caps[0] > caps[4]
        assert all(cap["limit"].startswith(f"batch cap of {cap['requests']} sequences: KV cache")
                   for cap in doc["batch_caps_at_workload"])
    text = " ".join(sdplan("show", "--ascii").stdout.split())
    assert "Requests each engine keeps running at 1024 prompt / 512 output tokens" in text
    assert "| no SD | 336 |" in text and "| k=1-3 | 254 |" in text and "| k=4 | 253 |" in text
    assert "max_num_seqs 1024 (" in text
    assert "vLLM fills the cache as requests run" in text
    assert doc["kv_cache_rule"].startswith("vLLM fills the cache as requests run")


def test_show_says_an_sglang_file_reserves_each_requests_output(sdplan, tmp_path: Path) -> None:
    """The cap caption names the file's own engine and rule: SGLang reserves a request's prompt and output (at most
    4,096 tokens of it) at admission, so its caps are the KV cache over ``p + g``, not vLLM's ``p + g/2 + 8``."""
    from sdplan.calibration import resolve_calibration

    cal = resolve_calibration(DEFAULT_CALIBRATION)
    text = Path(cal.path).read_text(encoding="utf-8")
    assert text.count('engine = "vllm"') == 1
    path = tmp_path / "sglang.toml"
    path.write_text(text.replace('engine = "vllm"', 'engine = "sglang"'), encoding="utf-8")
    derivation = cal.document["derivation"]
    doc = json.loads(sdplan("show", "-c", str(path), "-f", "json").stdout)
    assert doc["kv_cache_rule"] == ("SGLang reserves each request's prompt and output, at most 4,096 tokens of it, "
                                    "at admission")
    caps = {cap["draft_length_tokens"]: cap["requests"] for cap in doc["batch_caps_at_workload"]}
    assert caps[0] == derivation["kv_cache_tokens_without_draft"] // (1024 + 512)
    shown = " ".join(sdplan("show", "-c", str(path), "--ascii").stdout.split())
    assert "SGLang reserves each request's prompt and output" in shown and "vLLM fills" not in shown
