"""The first five minutes in a terminal: 80 columns, the answer first, assumptions said, completion, install lines."""

from __future__ import annotations

import contextlib
import io
import os
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

import sdplan._vllm.engine
import sdplan.measure.server
from sdplan.errors import ExitStatus
from tests.results_fixtures import write_vllm
from tests.served_fakes import FakeEngine, FakeServer, install_fake_served
from tests.test_cli_calibrate import FakeVllmRunner
from tests.test_scrape_prior import real_scrape, serving

#: One command line, as ``sdplan`` takes it.
Args = tuple[str, ...]

ROOT = Path(__file__).resolve().parent.parent
ELLIPSIS = "\u2026"


def assert_fits(text: str, width: int) -> None:
    for line in text.splitlines():
        assert len(line) <= width, f"{len(line)} columns: {line!r}"
    assert ELLIPSIS not in text and "..." not in text.replace("r_1 + ... + r_k", "")


@pytest.fixture
def narrow(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "80")


COMMANDS = [
    ("plan",),
    ("plan", "--acceptance", "0.6,0.8", "--policy", "goodput"),
    ("plan", "-c", "h100-sxm_qwen3-30b-a3b_qwen3-0.6b_derived"),
    ("check", "--rate", "8", "--slo", "e2e:mean<=5s", "--slo", "tpot:mean<=15ms", "--slo", "ttft:mean<=300ms"),
    ("capacity", "--slo", "e2e:mean<=4s", "--target-rate", "100", "--gpu-hour-cost", "2.5"),
    ("simulate", "--rates", "4", "--requests", "200", "--seeds", "2"),
    ("calibrations",),
    ("show",),
]


@pytest.mark.parametrize("args", COMMANDS, ids=lambda a: " ".join(a))
def test_every_table_fits_80_columns_without_cutting(sdplan, narrow, args) -> None:
    result = sdplan(*args)
    assert result.exit_code in (0, 1), result.output
    assert_fits(result.stdout, 80)


def test_fit_and_validate_fit_80_columns(sdplan, narrow, tmp_path) -> None:
    paths = write_vllm(tmp_path / "runs", noise=0.01)
    out = tmp_path / "fitted.toml"
    fit = sdplan("fit", *map(str, paths), "-o", str(out), "--holdout", "0.2")
    assert fit.exit_code == 0, fit.output
    assert_fits(fit.stdout, 80)
    # the title is a line of its own: never broken mid-phrase by a narrow table
    assert re.search(r"^Pooled fit at \d+ prompt / \d+ output tokens \(R2", fit.stdout, re.M)
    validate = sdplan("validate", "-c", str(out), *map(str, paths))
    assert validate.exit_code == 0, validate.output
    assert_fits(validate.stdout, 80)
    assert validate.stdout.startswith("Answer: MAPE")
    # and show of what fit wrote: its sources' sha256 digests are whole words longer than the value column
    shown = sdplan("show", "-c", str(out))
    assert shown.exit_code == 0, shown.output
    assert_fits(shown.stdout, 80)


def test_wide_tables_are_never_cut_even_past_the_width(sdplan, narrow) -> None:
    result = sdplan("plan", "--wide")
    assert result.exit_code == 0
    assert ELLIPSIS not in result.stdout
    header = next(line for line in result.stdout.splitlines() if line.startswith("\u2502 rate (req/s)"))
    for k in range(1, 9):
        assert f"k={k} (s)" in header  # one line per row: every k column, whole
    compact = sdplan("plan").stdout
    top = next(line for line in compact.splitlines() if line.startswith("\u256d"))
    assert top.count("\u252c") == 7  # compact: 8 columns (rate, no SD, best k, best, speedup, TPOT, rho, regime)


def test_columns_is_honoured_when_piped() -> None:
    env = dict(os.environ, COLUMNS="80", NO_COLOR="1")
    narrow = subprocess.run([sys.executable, "-m", "sdplan", "plan"], capture_output=True, text=True, env=env,
                            check=True)
    assert_fits(narrow.stdout, 80)
    env["COLUMNS"] = "150"
    wide = subprocess.run([sys.executable, "-m", "sdplan", "plan", "--wide"], capture_output=True, text=True,
                          env=env, check=True)
    assert max(map(len, wide.stdout.splitlines())) > 100
    del env["COLUMNS"]
    default = subprocess.run([sys.executable, "-m", "sdplan", "plan"], capture_output=True, text=True, env=env,
                             check=True)
    assert_fits(default.stdout, 80)  # piped without COLUMNS: 80


def test_print_table_wraps_between_words_and_never_cuts() -> None:
    from rich.console import Console
    from rich.table import Table

    from sdplan.render import print_table

    table = Table()
    for header in ("a rather long header", "another long header here", "short"):
        table.add_column(header)
    table.add_row("unbreakable-token-of-thirty-ch", "two words", "x" * 12)
    buffer = io.StringIO()
    print_table(Console(file=buffer, width=40, no_color=True), table, title="a title longer than the table is wide")
    text = buffer.getvalue()
    assert "unbreakable-token-of-thirty-ch" in text and "x" * 12 in text and ELLIPSIS not in text
    assert text.splitlines()[0] == "a title longer than the table is wide"
    # when even the narrowest layout is wider than the console, it is printed whole, one line per row
    buffer = io.StringIO()
    print_table(Console(file=buffer, width=20, no_color=True), table)
    assert "unbreakable-token-of-thirty-ch" in buffer.getvalue() and ELLIPSIS not in buffer.getvalue()


#: A calibration whose C2 grows with SD (k+1 tokens verified per step outweigh the fewer steps)
C2_RISES = "a100-sxm-80gb_llama-3.1-8b_llama-3.2-1b_roofline"


def test_plan_gives_the_answer_first_and_why(sdplan, narrow) -> None:
    text = sdplan("plan", "-c", C2_RISES).stdout
    first_table = text.index("\u256d")
    head = text[:first_table]
    assert "Answer: SD on" in head and "Why:" in head and "Caveat:" in head
    why = head[head.index("Why:"):]
    assert "C2" in why and "rises" in why and "shrinks" in why  # this calibration: C2 grows with k=3
    assert text.startswith("Answer: SD on")  # the decision before anything else
    assert "ASSUMED" in head  # the default acceptance is an assumption, said before any number
    off = sdplan("plan", "-c", C2_RISES, "--acceptance", "0.05", "-k", "4-8").stdout
    assert "Answer: SD off" in off


def test_answer_matches_the_table(sdplan, narrow) -> None:
    import json

    document = json.loads(sdplan("plan", "-f", "json").stdout)
    text = sdplan("plan").stdout
    saturation = document["baseline"]["saturation_rate_rps"]
    assert f"saturates at {saturation:.4g} req/s without SD" in " ".join(text.split())
    best_first = document["results"][0]["rates"][0]["best"]["draft_length_tokens"]
    assert f"k={best_first} at" in text


def test_assumptions_are_said_in_every_table(sdplan, narrow) -> None:
    for args in (("plan",), ("check", "--rate", "4", "--slo", "e2e:mean<=9s"), ("capacity", "--slo", "e2e:mean<=4s"),
                 ("simulate", "--rates", "4", "--requests", "100", "--seeds", "2")):
        text = " ".join(sdplan(*args).stdout.split())
        assert "per-token alpha 0.700 (assumed)" in text, args
    given = " ".join(sdplan("check", "--rate", "4", "--slo", "e2e:mean<=9s", "--acceptance", "0.8").stdout.split())
    assert "per-token alpha 0.800 (given)" in given and "ASSUMED" not in given


def test_capacity_and_check_answer_first(sdplan, narrow) -> None:
    capacity = sdplan("capacity", "--slo", "e2e:mean<=4s", "--acceptance", "0.8").stdout
    assert capacity.startswith("Answer: SD on with k=") and "Why:" in capacity
    check = sdplan("check", "-c", C2_RISES, "--rate", "8", "--slo", "e2e:mean<=5s")
    assert check.exit_code == 1 and check.stdout.startswith("Answer: FAIL")


def test_default_rate_grid_ends_on_a_stable_row(sdplan) -> None:
    import json

    for name in ("h100-sxm_llama-3.1-8b_llama-3.2-1b_derived", "l40s_qwen3-8b_qwen3-0.6b_derived"):
        rows = json.loads(sdplan("plan", "-c", name, "-f", "json").stdout)["results"][0]["rates"]
        assert rows[-1]["best"]["speculation"] != "unstable", name


def test_no_install_line_names_a_package_that_does_not_exist() -> None:
    files = [ROOT / "README.md", *sorted((ROOT / "man").rglob("*.[15]")), *sorted((ROOT / "sdplan").rglob("*.py"))]
    for path in files:
        assert "sdplan[" not in path.read_text(), f"{path} tells users to install sdplan[...] from an index"
    readme = (ROOT / "README.md").read_text()
    assert "pip install -e '.[plot]'" in readme and "pip install -e '.[calibrate]'" in readme


def test_completion_offers_shipped_calibrations_and_files(tmp_path, monkeypatch) -> None:
    from click.shell_completion import ShellComplete

    from sdplan.cli import cli

    monkeypatch.chdir(tmp_path)
    (tmp_path / "mine.toml").write_text("")
    complete = ShellComplete(cli, {}, "sdplan", "_SDPLAN_COMPLETE")
    names = [item.value for item in complete.get_completions(["plan", "-c"], "h100")]
    assert "h100-sxm_llama-3.1-8b_llama-3.2-1b_derived" in names
    assert all(name.startswith("h100") for name in names)
    kinds = {item.type for item in complete.get_completions(["check", "--calibration"], "mi")}
    assert "file" in kinds  # paths complete too (the shell lists mine.toml)
    env = dict(os.environ, _SDPLAN_COMPLETE="bash_source")
    script = subprocess.run([sys.executable, "-m", "sdplan"], capture_output=True, text=True, env=env)
    assert script.returncode == 0, script.stderr
    assert "_SDPLAN_COMPLETE=bash_complete" in script.stdout  # the script calls back into sdplan
    # and registers itself
    assert re.search(r"^\s*complete .*-F _sdplan_completion sdplan$", script.stdout, re.MULTILINE)


def test_capacity_has_one_batch_cap(sdplan) -> None:
    import json

    for option in ("--max-num-seqs", "--max-batch-size"):
        document = json.loads(sdplan("capacity", "--slo", "e2e:mean<=4s", option, "48", "-f", "json").stdout)
        assert document["num_speculative_tokens_per_batch_size"][-1][1] == 48, option
    assert "--max-batch-size" not in sdplan("capacity", "--help").stdout


def test_holdout_split_does_not_depend_on_file_order(sdplan, tmp_path) -> None:
    import json

    paths = [str(p) for p in write_vllm(tmp_path / "runs", noise=0.02)]
    reports = []
    for order in (paths, paths[::-1]):
        result = sdplan("fit", *order, "-o", str(tmp_path / "f.toml"), "--holdout", "0.25", "-f", "json")
        assert result.exit_code == 0, result.output
        reports.append(json.loads(result.stdout)["holdout"])
    assert reports[0] == reports[1]


def test_terminal_plot_legend_sits_under_the_panels(sdplan, narrow) -> None:
    text = sdplan("plan", "--plot", "--ascii").stdout
    assert "legend: + k=1, x k=2, o k=3" in text
    frame = text[text.index("speedup over no SD"):text.index("legend:", text.index("speedup over no SD"))]
    assert "k=3" not in frame.split("\n", 1)[1]  # nothing written over the curves


def test_fit_help_is_its_own(sdplan) -> None:
    text = " ".join(sdplan("fit", "--help").stdout.split())
    assert "one table each" not in text and "do not record acceptance" in text


def test_progress_only_on_a_terminal(sdplan) -> None:
    result = sdplan("simulate", "--rates", "4", "--requests", "100", "--seeds", "2")
    assert result.exit_code == 0 and "simulating" not in result.stderr and "simulating" not in result.stdout
    from sdplan.render.progress import progress_bar

    with progress_bar("simulating", 10) as advance:  # stderr is not a terminal here: silent, but callable
        advance(5, 10, "half")


def test_figures_say_the_assumption(sdplan, narrow) -> None:
    plan = " ".join(sdplan("plan", "--plot", "--ascii").stdout.split())
    assert "alpha 0.70 assumed" in plan
    capacity = " ".join(sdplan("capacity", "--slo", "e2e:mean<=4s", "--plot", "--ascii").stdout.split())
    assert "per replica, per-token alpha 0.700 (assumed)" in capacity  # a long title is kept, wrapped above


def test_moe_answer_reads_the_grid(sdplan, narrow) -> None:
    text = sdplan("plan", "-c", "h100-sxm_qwen3-30b-a3b_qwen3-0.6b_derived").stdout
    flat = " ".join(text.split())
    # with expert coverage SD's C2 grows with k (more experts streamed per verification): the grid says where
    # SD stops paying, as MoE has no closed-form break-even
    assert flat.startswith("Answer: SD on") and "the last rate of the grid with SD on" in flat
    assert "best per rate" in flat and "SD off above" in flat


def test_path_options_complete_files() -> None:
    from click.shell_completion import ShellComplete

    from sdplan.cli import cli

    complete = ShellComplete(cli, {}, "sdplan", "_SDPLAN_COMPLETE")
    for args in (["check", "-w"], ["plan", "-o"], ["plan", "--plot-file"]):
        assert [item.type for item in complete.get_completions(args, "x")] == ["file"], args


def _command_names() -> list[str]:
    import click

    from sdplan.cli import cli

    return cli.list_commands(click.Context(cli))


@pytest.mark.parametrize("command", _command_names())
def test_every_help_fits_80_columns(sdplan, narrow, command: str) -> None:
    """Examples are long command lines: they are split with backslashes, not cut or overflowing."""
    result = sdplan(command, "--help")
    assert result.exit_code == 0
    for line in result.stdout.splitlines():
        assert len(line) <= 80, f"{len(line)} columns: {line!r}"


def test_warnings_wrap_on_a_terminal_and_in_a_pipe() -> None:
    """stderr warnings: paragraphs with a hanging indent, wrapped to the terminal's width on a terminal and
    to COLUMNS in a pipe, the same words either way."""
    import pty

    served = ROOT / "tests" / "data" / "served-passes-cpu" / "served.toml"
    args = [sys.executable, "-m", "sdplan", "plan", "-c", str(served), "--prompt-tokens", "1024",
            "--output-tokens", "512", "-f", "json"]
    env = dict(os.environ, COLUMNS="80", NO_COLOR="1")
    piped = subprocess.run(args, capture_output=True, text=True, env=env, check=True)
    wide = subprocess.run(args, capture_output=True, text=True, env=dict(env, COLUMNS="1000"), check=True)
    one_line = wide.stderr.splitlines()
    assert one_line and all(line.startswith("warning: ") for line in one_line)
    assert max(map(len, one_line)) > 80  # what 80 columns get wrapped

    leader, follower = pty.openpty()
    subprocess.run(args, stdout=subprocess.DEVNULL, stderr=follower, env=env, check=True)
    os.close(follower)
    chunks = []
    while True:
        try:
            chunk = os.read(leader, 65536)
        except OSError:  # EIO: the terminal's other end is closed and drained
            break
        if not chunk:
            break
        chunks.append(chunk)
    os.close(leader)
    on_terminal = b"".join(chunks).decode().replace("\r\n", "\n").splitlines()
    for wrapped in (on_terminal, piped.stderr.splitlines()):
        assert_fits("\n".join(wrapped), 80)
        assert all(line.startswith(("warning: ", "  ")) for line in wrapped)
        assert sum(line.startswith("warning: ") for line in wrapped) == len(one_line)
        assert " ".join(" ".join(wrapped).split()) == " ".join(" ".join(one_line).split())  # nothing lost


_CPU = "cpu-epyc-2core_tiny-llama-h256-l4_tiny-llama-h128-l1_measured"


def _served_poor_fit(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, stack: contextlib.ExitStack) -> list[Args]:
    """A served calibration on a fake engine whose runs land 40% apart at random: the sweep's notes and the
    poor-fit verdict (exit 7)."""
    install_fake_served(monkeypatch, tmp_path).engine = FakeEngine(run_noise=0.4)
    return [("calibrate", "--target", "target", "--draft", "draft", "-o", "cal.toml", "--prompt-tokens", "128",
             "--output-tokens", "64", "--draft-lengths", "2")]


def _endpoint_sweep(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, stack: contextlib.ExitStack) -> list[Args]:
    """A calibration of a running server (--endpoint) whose max_num_seqs is unknown: the note that saturation
    is extrapolated, and the summary of what was written."""
    install_fake_served(monkeypatch, tmp_path).engine = FakeEngine(step_fixed_s=0.01, step_per_request_s=0.00002,
                                                                   prefill_s=0.0)
    monkeypatch.setattr(sdplan.measure.server, "served_model_name", lambda url: "their-model")
    monkeypatch.setattr(sdplan.measure.server, "probe_draft_length", lambda url: 0)
    FakeServer(model="their-model", arguments=[], log_path=tmp_path / "theirs.log").start()
    return [("calibrate", "--endpoint", "http://127.0.0.1:8000", "-o", "theirs.toml", "--prompt-tokens", "128",
             "--output-tokens", "64", "--accept-poor-fit")]


def _engine_calibration(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, stack: contextlib.ExitStack) -> list[Args]:
    """``--method engine`` on a synthetic engine standing in for vLLM: the summary of what was written."""
    FakeVllmRunner.instances = []
    FakeVllmRunner.fail_after = None
    monkeypatch.setattr(sdplan._vllm.engine, "VllmRunner", FakeVllmRunner)
    return [("calibrate", "--method", "engine", "--target", "tgt", "--draft", "drf", "-o", "box.toml", "--grid",
             "quick", "--dtype", "float32")]


def _derive_to_stdout(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, stack: contextlib.ExitStack) -> list[Args]:
    """``derive -o -``: its progress lines, and its report on stderr (the file takes stdout)."""
    pytest.importorskip("aiconfigurator_core.sdk.engine",
                        reason="aiconfigurator-core is not installed (pip install -e '.[test]' on Python 3.11+)")
    return [("derive", "--target-model", "meta-llama/Llama-3.1-8B-Instruct", "--system", "h100_sxm", "--method",
             "ngram", "--draft-lengths", "1-3", "--date", "2026-11-25", "-o", "-")]


def _scrape_appending(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, stack: contextlib.ExitStack) -> list[Args]:
    """Two recordings of a loopback server's /metrics into one file: the second's summary says what it appended to."""
    url = stack.enter_context(serving(real_scrape()))
    return [("scrape", url, "--every", "200ms", "--for", "0.2s", "-o", "live.scrapes")] * 2


#: Each command's plain form, and the forms whose notes on stderr ran past 80 columns before they were
#: wrapped: plan's batch caveats (JSON and a measured CPU calibration), check's verdict on a miss,
#: capacity's engine configuration summary; calibrate's sweep notes and poor-fit verdict, scrape's summary
#: of a recording appended to a file. A function sets up fakes for the commands that measure and returns
#: the commands to run.
STDERR_COMMANDS: list[Args | Callable[[pytest.MonkeyPatch, Path, contextlib.ExitStack], list[Args]]] = [
    ("plan",),
    ("plan", "-f", "json"),
    ("plan", "-c", _CPU, "-f", "json"),
    ("check", "--rate", "8", "--slo", "e2e:mean<=5s"),
    ("check", "--rate", "12", "--slo", "e2e:mean<=2s", "--draft-length", "3"),
    ("capacity", "--slo", "e2e:mean<=5s"),
    ("capacity", "--slo", "e2e:mean<=5s", "-f", "vllm-config"),
    ("simulate", "--rates", "4", "--requests", "100", "--seeds", "1"),
    ("validate", "-c", _CPU, str(ROOT / "tests" / "data" / "served-cpu")),
    _served_poor_fit,
    _endpoint_sweep,
    _engine_calibration,
    _derive_to_stdout,
    _scrape_appending,
]


def _case_id(case: object) -> str:
    if callable(case):
        return case.__name__.strip("_").replace("_", " ")
    return " ".join(Path(x).name for x in case)  # type: ignore[attr-defined]


@pytest.mark.parametrize("case", STDERR_COMMANDS, ids=_case_id)
def test_every_stderr_line_fits_80_columns(sdplan, monkeypatch, tmp_path, case) -> None:
    """Warnings, caveats, notes and verdicts on stderr are wrapped at 80 columns off a terminal, as tables are.

    The commands run in ``tmp_path`` and name their files relative to it: a path is one word, which a note
    keeps whole on a line of its own, so a long temporary folder would say nothing of the wrapping.
    """
    monkeypatch.delenv("COLUMNS", raising=False)
    monkeypatch.chdir(tmp_path)
    with contextlib.ExitStack() as stack:
        runs = case(monkeypatch, tmp_path, stack) if callable(case) else [case]
        for args in runs:
            result = sdplan(*args)
            assert result.exit_code in (0, 1, ExitStatus.POOR_CALIBRATION), result.output
            assert result.stderr.strip() or not callable(case), "nothing on stderr: the set-up checks no note"
            for line in result.stderr.splitlines():
                assert len(line) <= 80, f"{len(line)} columns: {line!r}"


@pytest.mark.parametrize("command", ["fit", "derive"])
def test_a_report_on_stderr_takes_stderr_s_width(sdplan, monkeypatch, tmp_path, command) -> None:
    """With ``-o -`` the file takes standard output and the report goes to standard error, drawn at standard
    error's width (a terminal there while stdout is piped), not at standard output's (80 columns off a
    terminal): here a 64-column standard error. Tables are drawn whole at any width (:func:`print_table`); their
    titles and the notes wrap."""
    monkeypatch.delenv("COLUMNS", raising=False)
    monkeypatch.setattr("sdplan.render.stderr_width", lambda: 64)
    if command == "fit":
        args = ("fit", str(ROOT / "tests" / "data" / "served-cpu"), "-o", "-")
    else:
        pytest.importorskip("aiconfigurator_core.sdk.engine",
                            reason="aiconfigurator-core is not installed (pip install -e '.[test]' on Python 3.11+)")
        args = _derive_to_stdout(monkeypatch, tmp_path, contextlib.ExitStack())[0]
    result = sdplan(*args)
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith("#") or "schema_version" in result.stdout  # the calibration itself
    lines = result.stderr.splitlines()
    assert any(line.startswith("╭") for line in lines), "no table on stderr"
    text = [line for line in lines if line[:1] not in "╭│├╰"]  # tables are not cut to fit; their titles and notes
    assert max(len(line) for line in text) <= 64, max(text, key=len)
