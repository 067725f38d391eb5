"""Bad-input fuzzing of the whole command line: input strategies and the property every input must meet.

Shared by the property test in the suite (``tests/test_fuzz_cli.py``, derandomised, a few thousand inputs)
and the long run (:func:`main`, >= 10^4 inputs, figures printed). Each input is a command
line for one command plus the files it names (calibrations, workloads, length histograms, benchmark
results, mutated at the byte and the key level), an output path (folders, '', /dev/full and /dev/null, long names,
a mode-000 folder, an existing file) and sometimes an environment variable. The property:

* the exit status is one of the documented ones, never 70 (internal error);
* no traceback and no uncaught exception;
* nothing half-written: no temporary file left behind, a JSON output parses, and a run that fails
  before its answer (exit 2, 3, 5, 6) leaves an existing output file as it was;
* an answer within ``time_limit_s``.

Strategies are of two kinds. :func:`cases` covers every command with inputs that exercise option
parsing, SLOs, calibrations, workloads, length files, budgets and output paths; for ``fit``,
``validate`` and ``calibrate`` it only varies options and output paths around a valid results file.
:func:`reader_cases` mutates the *content* of benchmark result files (vLLM, GuideLLM, CSV) for the
readers of ``fit``/``validate``; it runs in the suite, and at length with ``python -m tests.fuzz_cli --readers``.

The long run, from the repository's root: the property of ``tests/test_fuzz_cli.py`` (no exit 70, no
traceback, nothing half-written, bounded time) on many more inputs, with larger simulations than the suite
allows. It prints: inputs run, exit statuses, time percentiles, the slowest inputs, peak memory, and every
input that broke the property (grouped by problem). Exit status 1 if any did.

    python -m tests.fuzz_cli                 # 10,000 inputs, seed 0
    python -m tests.fuzz_cli -n 20000 --seed 7 --time-limit 60
    python -m tests.fuzz_cli -n 2000 --large    # simulations at default sizes (slow)
    python -m tests.fuzz_cli --readers       # also mutate result files, speculation profiles and
                                             # InferenceX rows, and simulate huge prompts
"""

from __future__ import annotations

import copy
import json
import os
import signal
import stat
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hypothesis import strategies as st

from sdplan.errors import ExitStatus
from sdplan.fileio import dumps_toml

#: What ``python -m tests.fuzz_cli --help`` says it is.
LONG_RUN = "Long bad-input run of the whole CLI: >= 10^4 inputs, figures printed."

#: Exit statuses a user may see (sdplan(1), EXIT STATUS), 70 excluded.
DOCUMENTED = {status.value for status in ExitStatus} - {ExitStatus.INTERNAL.value}
#: Exit statuses that mean "failed before writing the answer".
FAILED_EARLY = {2, 3, 5, 6}

ROOT = Path(__file__).resolve().parent.parent

# ----------------------------------------------------------------------------- values

EDGE_TEXT = [
    "", " ", "0", "-0", "-1", "1", "2", "0.5", "1e308", "-1e308", "1e400", "1e-320", "inf", "-inf", "nan", "NaN",
    "99999999999999999999", "1" + "0" * 400, "0x10", "1_000", "½", "٣", "1,2", "1:10:1", "\n", "1\n2", "%", "50%",
    "-", "1-", "-5-3", "é", "\x00", "\x1b[31m", "a" * 300, "1e6", "1000000", "100000000", "0.0001", "62%",
]


def number_text(low: float = -10.0, high: float = 1e3) -> st.SearchStrategy[str]:
    """A number as the user might type it: mostly plausible, sometimes nonsense."""
    plausible = st.one_of(st.integers(max(int(low), 0), int(high)).map(str),
                          st.floats(max(low, 0.0), high, allow_nan=False).map(lambda x: f"{x:.4g}"))
    return st.one_of(
        plausible, plausible, plausible, plausible, plausible, plausible,
        st.integers(int(low), int(high)).map(str),
        st.sampled_from(EDGE_TEXT),
        st.integers().map(str),
        st.floats().map(repr),
        st.text(max_size=6),
    )


def list_text(item: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
    piece = st.one_of(item, st.tuples(item, item, item).map(":".join), st.tuples(item, item).map("-".join))
    return st.lists(piece, min_size=1, max_size=4).map(",".join)


RATES = st.one_of(list_text(number_text(0, 40)), st.sampled_from(["0:99999:1", "1:20:0.5", "0:1e308:1e-300",
                                                                  "1:27000:1", "0.5:16:0.5", "1,6"]))
DRAFT_LENGTHS = st.one_of(
    st.sampled_from(["1-8", "1-4", "1,2,4", "0", "0-3", "1-1024", "1-1025", "1-100000", "3-1", "99999999999999999999",
                     "1-", "-1", "a", "", "1, 2", "2-2", "0,0"]),
    list_text(number_text(0, 12)),
)
ALPHAS = st.one_of(list_text(number_text(0, 1)), st.sampled_from(["0", "1", "0.7", "0:1:0.0001", "62%", "1.01"]))

SLO_TEXT = st.one_of(
    st.builds(
        lambda metric, stat_, op, value, unit: f"{metric}{':' + stat_ if stat_ is not None else ''}{op}{value}{unit}",
        st.sampled_from(["e2e", "ttft", "tpot", "throughput", "utilisation", "utilization", "latency", "e2el", "foo",
                         "", "E2E"]),
        st.sampled_from([None, "mean", "p50", "p90", "p99", "p99.9", "p95", "p0", "p100", "median", "pnan", "p1e1",
                         "", "p-1", "max", "P99", "p99.99999", "p.5"]),
        st.sampled_from(["<=", "<", ">=", ">", "=", "", "=<"]),
        number_text(0, 5000),
        st.sampled_from(["s", "ms", "us", "min", "tok/s", "tokens/s", "rps", "req/s", "%", "", "h", "Ms", " s"]),
    ),
    st.text(max_size=20),
)

# ----------------------------------------------------------------------------- files


def _shipped(name: str) -> dict[str, Any]:
    import tomllib

    return tomllib.loads((ROOT / "calibrations" / f"{name}.toml").read_text(encoding="utf-8"))


BASE_CALIBRATIONS = [
    _shipped("h100-sxm_llama-3.1-8b_llama-3.2-1b_derived"),
    _shipped("cpu-epyc-2core_tiny-llama-h256-l4_tiny-llama-h128-l1_measured"),
    {
        "schema_version": 1, "name": "fuzz-direct",
        "provenance": {"method": "fit", "hardware": "gpu", "target_model": "t", "draft_model": "d",
                       "engine": "vllm", "engine_version": "0", "date": "2026-11-22"},
        "reference_workload": {"prompt_tokens": 1000, "output_tokens": 500},
        "fit_quality": {"r2": 0.99},
        "coefficients": {"c1p_s": 0.05, "c2p_s": 0.01,
                         "baseline": {"c1_step_s": 0.008, "c2_step_s": 0.0001},
                         "speculative": {"c1v_s": 0.009, "c2v_s": 0.0001, "c1d_s": 0.001, "c2d_s": 0.00005}},
    },
]
BASE_WORKLOAD: dict[str, Any] = {
    "schema_version": 1, "name": "chat", "calibration": "h100-sxm_llama-3.1-8b_llama-3.2-1b_derived",
    "slos": ["e2e:mean<=5s", "tpot:mean<=40ms"],
    "traffic": {"request_rate_rps": 4.0, "target_rate_rps": 50.0, "prompt_tokens": 512, "output_tokens": 256},
    "acceptance": {"per_token_alpha": 0.75},
    "speculation": {"mode": "best", "draft_lengths": [1, 2, 3, 4]},
    "deployment": {"gpus_per_replica": 1, "gpu_hour_cost_usd": 2.5, "max_batch_size": 128},
}

_NAN, _INF, _NINF = "__fuzz_nan__", "__fuzz_inf__", "__fuzz_ninf__"

VALUES = st.one_of(
    st.sampled_from([0, 0.0, -1, 1, 1e308, -1e308, 1e-308, 5e-324, 2**63, 10**30, 3600.0, 3601.0, 1e-9, 0.5, 1.5,
                     _NAN, _INF, _NINF, True, "", "x\ny", "é" * 3, [], [1, 2], [1e308], ["a"], "2026-13-45",
                     "1e308", 123456789, 99999999999999999999]),
    st.integers(-10, 10**9),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=12),
    st.lists(st.floats(-2, 1e9, allow_nan=False), max_size=4),
    st.just({"nested": 1}),
)


def _leaves(document: dict[str, Any], prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    paths = []
    for key, value in document.items():
        paths.append((*prefix, key))
        if isinstance(value, dict):
            paths.extend(_leaves(value, (*prefix, key)))
    return paths


@st.composite
def mutated_document(draw: st.DrawFn, bases: list[dict[str, Any]]) -> dict[str, Any]:
    document = copy.deepcopy(draw(st.sampled_from(bases)))
    for _ in range(draw(st.integers(0, 3))):
        paths = _leaves(document)
        if not paths:
            break
        path = draw(st.sampled_from(paths))
        parent = document
        for key in path[:-1]:
            parent = parent[key]
        action = draw(st.sampled_from(["set", "set", "set", "delete", "add", "zero", "scale", "scale"]))
        if action == "delete":
            del parent[path[-1]]
        elif action == "add":
            parent[draw(st.sampled_from(["extra", "c1p_ms", "rate", "x y"]))] = copy.deepcopy(draw(VALUES))
        elif action == "scale":  # every number of the table times a factor: units mistaken, magnitudes absurd
            factor = draw(st.sampled_from([0.0, 1e-300, 1e-12, 1e-3, 1e3, 1e6, 1e300]))
            _scale(parent, factor)
        elif action == "zero" and isinstance(parent[path[-1]], dict):
            parent[path[-1]] = {key: 0.0 for key in parent[path[-1]]}
        else:
            parent[path[-1]] = copy.deepcopy(draw(VALUES))  # never mutate the strategy's own constants
    return document


def _scale(table: dict[str, Any], factor: float) -> None:
    for key, value in table.items():
        if isinstance(value, dict):
            _scale(value, factor)
        elif isinstance(value, float) and key.endswith("_s"):
            scaled = value * factor
            table[key] = (scaled if scaled - scaled == 0 else  # finite
                          _NAN if scaled != scaled else _INF if scaled > 0 else _NINF)


def toml_text(document: dict[str, Any]) -> str:
    """TOML for a mutated document; nan and inf become TOML's own literals."""

    def swap(value: Any) -> Any:
        if isinstance(value, dict):
            return {key: swap(item) for key, item in value.items()}
        if isinstance(value, list):
            return [swap(item) for item in value]
        if isinstance(value, int) and not isinstance(value, bool) and abs(value) >= 2**63:
            return f"__fuzz_int_{value}__"
        return value

    text = dumps_toml(swap(document))
    for marker, literal in ((_NAN, "nan"), (_INF, "inf"), (_NINF, "-inf")):
        text = text.replace(json.dumps(marker), literal)
    import re

    return re.sub(r'"__fuzz_int_(-?\d+)__"', r"\1", text)


@st.composite
def file_bytes(draw: st.DrawFn, text: str) -> bytes:
    """The text encoded as a user's editor might have saved it, sometimes damaged."""
    encoding = draw(st.sampled_from(["utf-8", "utf-8", "utf-8", "utf-8-sig", "utf-16", "utf-16-le", "latin-1"]))
    data = text.encode(encoding, errors="replace")
    damage = draw(st.sampled_from(["none", "none", "none", "truncate", "insert", "empty", "binary"]))
    if damage == "truncate" and data:
        data = data[: draw(st.integers(0, len(data) - 1))]
    elif damage == "insert":
        at = draw(st.integers(0, len(data)))
        data = data[:at] + draw(st.binary(min_size=1, max_size=8)) + data[at:]
    elif damage == "empty":
        data = b""
    elif damage == "binary":
        data = draw(st.binary(max_size=64))
    return data


CALIBRATION_FILE = mutated_document(BASE_CALIBRATIONS).map(toml_text).flatmap(file_bytes)
WORKLOAD_FILE = mutated_document([BASE_WORKLOAD]).map(toml_text).flatmap(file_bytes)


@st.composite
def lengths_file(draw: st.DrawFn) -> bytes:
    header = draw(st.sampled_from(["prompt_tokens,output_tokens,weight", "prompt_tokens,output_tokens",
                                   "output_tokens,prompt_tokens,weight", "p,g,w", ""]))
    rows = draw(st.lists(st.tuples(number_text(1, 4096), number_text(1, 2048), number_text(0, 10)), max_size=6))
    text = "\n".join([header, *(",".join(row) for row in rows)]) + "\n"
    return draw(file_bytes(text))


def results_csv() -> str:
    """A valid benchmark CSV (fit/validate input) from the model itself."""
    import tempfile

    from tests.results_fixtures import write_csv

    with tempfile.TemporaryDirectory() as folder:
        return write_csv(Path(folder) / "runs.csv").read_text()


# ----------------------------------------------------------------------------- command lines

OUTPUTS = st.sampled_from([
    None, None, None, "-", "out.json", "out.txt", "", ".", "..", "/", "adir", "adir/", "missing/x.json",
    "a" * 300, "b" * 250 + ".txt", "full", "null", "locked/x.json", "existing.json", "out\nname.json",
])
CALIBRATION_REFS = st.sampled_from([
    "cal.toml", "cal.toml", "cal.toml", "h100-sxm_llama-3.1-8b_llama-3.2-1b_derived", "nonexistent.toml",
    "nope", "adir", "locked/cal.toml", "c" * 300 + ".toml", "", "null", "cal.toml\n",
])


@dataclass
class Case:
    """One input: a command line and the files and environment it runs with."""

    argv: list[str]
    files: dict[str, bytes] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)
    output: str | None = None
    fmt: str | None = None

    def __str__(self) -> str:
        extra = f" files={sorted(self.files)}" if self.files else ""
        env = f" env={self.env}" if self.env else ""
        return "sdplan " + " ".join(repr(arg) if not arg or not arg.isprintable() or " " in arg else arg
                                    for arg in self.argv) + extra + env


def _options(draw: st.DrawFn, choices: dict[str, st.SearchStrategy[str] | None], most: int = 5) -> list[str]:
    names = draw(st.lists(st.sampled_from(sorted(choices)), max_size=most, unique=True))
    argv: list[str] = []
    for name in names:
        value = choices[name]
        argv.append(name)
        if value is not None:
            argv.append(draw(value))
    return argv


def _simulation(small: bool) -> dict[str, st.SearchStrategy[str] | None]:
    requests = (st.one_of(st.integers(10, 200).map(str), st.sampled_from(["9", "0", "2000000", "10000001",
                                                                          "99999999999999999999", "x"]))
                if small else st.one_of(st.integers(10, 30000).map(str), number_text(0, 10**7)))
    seeds = st.one_of(st.sampled_from(["1", "2", "0", "1001", "-1"])) if small else number_text(0, 20)
    return {
        "--requests": requests, "--seeds": seeds, "--seed": st.sampled_from(["0", "-1", "7", str(2**64), "x"]),
        "--arrival-cv": st.sampled_from(["1", "0.05", "0.01", "2", "10", "1e6", "inf", "nan"]),
        "--max-num-seqs": st.sampled_from(["1", "8", "256", "0", "1000001", "99999999999999999999"]),
        "--max-num-batched-tokens": st.sampled_from(["1", "64", "8192", "0"]),
        "--kv-cache-tokens": st.sampled_from(["1", "1000", "1e6", "inf", "0"]),
        "--lengths-file": st.sampled_from(["lengths.csv", "lengths.csv", "nonexistent.csv", "adir"]),
    }


def _workload_flags() -> dict[str, st.SearchStrategy[str] | None]:
    return {
        "--prompt-tokens": number_text(1, 8192), "--output-tokens": number_text(1, 4096),
        "--acceptance": ALPHAS, "--acceptance-length": list_text(number_text(1, 9)),
        "--draft-acceptance-rate": list_text(number_text(0, 1)), "--acceptance-k": number_text(1, 8),
        "--position-acceptance": list_text(number_text(0, 1)),
    }


@st.composite
def cases(draw: st.DrawFn, small: bool = True, plots: bool = False) -> Case:
    """An input to any command (see the module docstring).

    ``small`` keeps simulations to a fraction of a second; ``plots`` adds ``--plot-file`` (matplotlib
    takes about a second per figure, too slow for the suite).
    """
    command = draw(st.sampled_from(["plan", "plan", "show", "calibrations", "check", "check", "capacity", "capacity",
                                    "simulate", "fit", "validate", "calibrate"]))
    files: dict[str, bytes] = {}
    env: dict[str, str] = {}
    if draw(st.integers(0, 9)) == 0:
        env["SDPLAN_WORK_LIMIT"] = draw(st.sampled_from(["0.5", "2", "abc", "-1", "inf", "0", ""]))
    common: dict[str, st.SearchStrategy[str] | None] = {
        "-c": CALIBRATION_REFS, "-f": st.sampled_from(["table", "json", "csv", "vllm-config", "yaml"]),
        "--ascii": None, "-o": OUTPUTS.map(lambda o: o if o is not None else "-"),
    }
    if draw(st.integers(0, 3)) > 0:
        files["cal.toml"] = draw(CALIBRATION_FILE)
    if command == "plan":
        flags = {**common, **_workload_flags(), "-r": RATES, "-k": DRAFT_LENGTHS,
                 "--policy": st.sampled_from(["best-static", "goodput", "x"]), "--plot": None}
    elif command == "show":
        flags = {**common, "--prompt-tokens": number_text(1, 8192), "--output-tokens": number_text(1, 4096)}
    elif command == "calibrations":
        flags = {"-f": common["-f"], "-o": common["-o"], "--ascii": None}
    elif command in ("check", "capacity"):
        files["workload.toml"] = draw(WORKLOAD_FILE)
        flags = {**common, **_workload_flags(), "-w": st.sampled_from(["workload.toml", "nonexistent.toml", "adir"]),
                 "--slo": SLO_TEXT, "-k": DRAFT_LENGTHS, "--simulate": None}
        if command == "check":
            flags.update({"-r": number_text(0, 30), "--draft-length": st.sampled_from(["best", "off", "0", "3", "-1",
                                                                                      "1025", "x", "goodput"])})
        else:
            flags.update({"--target-rate": number_text(0, 1000), "--gpus-per-replica": number_text(1, 8),
                          "--gpu-hour-cost": number_text(0, 10), "--max-batch-size": number_text(1, 1024),
                          "--spec-method": st.sampled_from(["eagle", "draft_model", "x\ny"])})
    elif command == "simulate":
        flags = {**common, **_workload_flags(), "-r": RATES, "-k": DRAFT_LENGTHS,
                 "--draft-length": st.sampled_from(["best", "off", "goodput", "2", "0", "1025", "x"])}
    else:
        return draw(_reader_option_case(command))
    if plots and command in ("plan", "capacity", "simulate"):
        flags["--plot-file"] = st.sampled_from(["p.png", "p.svg", "p.pdf", "adir", "adir/.png", "null",
                                                "missing/p.png", "q" * 300 + ".png", "existing.json"])
    argv = [command, *_options(draw, flags, most=draw(st.sampled_from([2, 4, 6])))]
    if command == "simulate" or "--simulate" in argv:
        sim = _options(draw, _simulation(small), most=4)
        if small:  # keep each simulation to a fraction of a second in the suite
            if "--requests" not in sim:
                sim += ["--requests", draw(st.sampled_from(["50", "200"]))]
            if "--seeds" not in sim:
                sim += ["--seeds", "1"]
            if command == "capacity":
                argv += ["-k", "1-2"]
            if command != "check" and "-r" not in argv:
                argv += ["-r", draw(st.sampled_from(["1", "2,4"]))]
        argv += sim
        if "--lengths-file" in argv:
            files["lengths.csv"] = draw(lengths_file())
    if command in ("check", "capacity") and draw(st.integers(0, 4)) > 0 and "--slo" not in argv:
        argv += ["--slo", draw(st.one_of(SLO_TEXT, st.sampled_from(["e2e:mean<=5s", "tpot:mean<=30ms",
                                                                     "e2e:p99<=10s", "ttft:p95<=300ms"])))]
    if command in ("check", "capacity") and "-w" not in argv and draw(st.booleans()):
        argv += ["-w", "workload.toml"]
    if command == "check" and "-r" not in argv and draw(st.integers(0, 3)) > 0:
        argv += ["-r", draw(number_text(0, 30))]
    if "-c" not in argv and command != "calibrations" and draw(st.integers(0, 2)) > 0:
        argv += ["-c", "cal.toml"]
        files.setdefault("cal.toml", draw(CALIBRATION_FILE))
    output = argv[argv.index("-o") + 1] if "-o" in argv else None
    fmt = argv[argv.index("-f") + 1] if "-f" in argv else "table"
    return Case(argv=argv, files=files, env=env, output=output, fmt=fmt)


TEMPLATES = [
    ["plan", "-c", "cal.toml"],
    ["plan", "-c", "cal.toml", "-f", "json", "--policy", "goodput"],
    ["show", "-c", "cal.toml", "-f", "json"],
    ["check", "-w", "workload.toml", "-c", "cal.toml"],
    ["check", "-w", "workload.toml", "--rate", "3", "-f", "json"],
    ["capacity", "-w", "workload.toml", "-c", "cal.toml", "--target-rate", "100", "-f", "json"],
    ["capacity", "-w", "workload.toml", "-f", "vllm-config"],
    ["simulate", "-c", "cal.toml", "-r", "2", "--requests", "100", "--seeds", "1"],
    ["simulate", "-r", "1", "--requests", "100", "--seeds", "1", "--lengths-file", "lengths.csv", "-f", "json"],
    ["simulate", "-r", "1", "--requests", "100", "--seeds", "1", "--draft-length", "goodput", "-k", "1-4"],
    ["check", "--simulate", "-c", "cal.toml", "-r", "2", "--slo", "e2e:p99<=10s", "--requests", "100", "--seeds", "1"],
    ["capacity", "--simulate", "--slo", "e2e:p99<=10s", "-k", "1-2", "--requests", "30", "--seeds", "1"],
]


@st.composite
def focused_cases(draw: st.DrawFn) -> Case:
    """A valid command line with one thing wrong: a file mutated once, or one option's value replaced.

    Broad inputs mostly stop at option parsing; these reach the core and the renderers.
    """
    argv = list(draw(st.sampled_from(TEMPLATES)))
    command = argv[0]
    files = {"cal.toml": toml_text(BASE_CALIBRATIONS[0]).encode(), "workload.toml": toml_text(BASE_WORKLOAD).encode(),
             "lengths.csv": b"prompt_tokens,output_tokens,weight\n512,128,3\n2048,256,1\n"}
    target = draw(st.sampled_from(["cal.toml", "workload.toml", "lengths.csv", "option", "option", "output"]))
    if target == "cal.toml":
        files["cal.toml"] = toml_text(draw(_once(BASE_CALIBRATIONS))).encode()
    elif target == "workload.toml":
        files["workload.toml"] = toml_text(draw(_once([BASE_WORKLOAD]))).encode()
    elif target == "lengths.csv":
        files["lengths.csv"] = draw(lengths_file())
    elif target == "option":
        flags = {**_workload_flags(), "-k": DRAFT_LENGTHS}
        if command in ("plan", "simulate"):
            flags["-r"] = RATES
        if command in ("check", "capacity"):
            flags["--slo"] = SLO_TEXT
        if command == "check":
            flags["--rate"] = number_text(0, 30)
        if command == "capacity":
            flags.update({"--target-rate": number_text(0, 1e6), "--gpu-hour-cost": number_text(0, 10),
                          "--gpus-per-replica": number_text(1, 8), "--max-batch-size": number_text(1, 1024)})
        if command == "simulate" or "--simulate" in argv:
            flags.update({key: value for key, value in _simulation(True).items()
                          if key not in ("--requests", "--seeds")})
        name = draw(st.sampled_from(sorted(flags)))
        argv += [name, draw(flags[name])]  # type: ignore[arg-type]
    if target == "output" or "-o" not in argv and draw(st.booleans()):
        argv += ["-o", draw(OUTPUTS.map(lambda o: o if o is not None else "out.json"))]
    output = argv[argv.index("-o") + 1] if "-o" in argv else None
    fmt = argv[argv.index("-f") + 1] if "-f" in argv else "table"
    return Case(argv=argv, files=files, output=output, fmt=fmt)


def _once(bases: list[dict[str, Any]]) -> st.SearchStrategy[dict[str, Any]]:
    """A document with one to three mutations (see :func:`mutated_document`)."""

    @st.composite
    def build(draw: st.DrawFn) -> dict[str, Any]:
        for _ in range(20):
            document = draw(mutated_document(bases))
            if document not in bases:
                return document
        return document

    return build()


@st.composite
def _reader_option_case(draw: st.DrawFn, command: str) -> Case:
    """fit, validate, calibrate: options and output paths around valid inputs (not the readers' content)."""
    if command == "calibrate":
        # never starts an engine: --target is left out or an option is malformed, so parsing fails first
        flags = {"--draft": st.sampled_from(["d", ""]), "-o": OUTPUTS.map(lambda o: o or "x.toml"),
                 "--grid": st.sampled_from(["quick", "huge", ""]), "--name": st.text(max_size=8)}
        argv = ["calibrate", *_options(draw, flags)]
        if draw(st.booleans()):
            argv += ["--target", "t", "--grid", "nonsense"]
        return Case(argv=argv, output=None, fmt="table")
    files = {"runs.csv": RESULTS_CSV.encode()}
    flags: dict[str, st.SearchStrategy[str] | None] = {
        "-f": st.sampled_from(["table", "json", "csv"]),
        "--input-format": st.sampled_from(["auto", "csv", "vllm", "guidellm", "x"]),
        "--ascii": None,
    }
    if command == "fit":
        flags.update({"-o": OUTPUTS.map(lambda o: o if o is not None else "fit.toml"),
                      "--draft-length": st.sampled_from(["0", "4", "-1", "99999999999999999999"]),
                      "--hardware": st.text(max_size=10), "--target-model": st.sampled_from(["m", "x\ny"])})
    else:
        flags.update({"-c": CALIBRATION_REFS, "--max-error": st.sampled_from(["10%", "0.1", "-1", "inf", "x"])})
        if draw(st.booleans()):
            files["cal.toml"] = draw(CALIBRATION_FILE)
    argv = [command, *_options(draw, flags), draw(st.sampled_from(["runs.csv", "runs.csv", "nonexistent.json",
                                                                   "adir"]))]
    if command == "fit" and "-o" not in argv:
        argv += ["-o", draw(OUTPUTS.map(lambda o: o if o is not None else "fit.toml"))]
    output = argv[argv.index("-o") + 1] if "-o" in argv else None
    fmt = argv[argv.index("-f") + 1] if "-f" in argv else "table"
    if command == "fit":
        fmt = "toml"  # -o of fit is the calibration; the report goes to stdout
    return Case(argv=argv, files=files, output=output, fmt=fmt)


RESULTS_CSV = results_csv()


@st.composite
def reader_cases(draw: st.DrawFn) -> Case:
    """Mutated benchmark result files for fit/validate: the readers' content (off until they are rewritten)."""
    base = json.loads(json.dumps({
        "date": "20261122-120000", "backend": "vllm", "num_prompts": 200, "request_rate": 2.0, "completed": 200,
        "failed": 0, "duration": 100.0, "mean_e2el_ms": 3000.0, "mean_ttft_ms": 50.0, "mean_tpot_ms": 6.0,
        "total_input_tokens": 204800, "total_output_tokens": 102400,
    }))
    document = draw(mutated_document([base]))
    kind = draw(st.sampled_from(["vllm", "guidellm", "csv"]))
    if kind == "guidellm":
        metrics = draw(mutated_document([{"request_totals": {"successful": 1}}]))
        text = json.dumps({"benchmarks": [{"metrics": metrics}]})
    elif kind == "csv":
        text = RESULTS_CSV if draw(st.booleans()) else draw(st.text(max_size=200))
    else:
        text = json.dumps(document, default=str)
    files = {"r.json": draw(file_bytes(text))}
    command = draw(st.sampled_from(["fit", "validate"]))
    argv = [command, "--input-format", draw(st.sampled_from(["auto", kind])), "r.json"]
    if command == "fit":
        argv += ["-o", "fit.toml"]
    return Case(argv=argv, files=files, output="fit.toml" if command == "fit" else None, fmt="toml")


# ----------------------------------------------------------------------------- SD inputs from the field

DATA = ROOT / "tests" / "data"


def _json(path: Path) -> Any:
    return json.loads(path.read_text(encoding="utf-8"))


def _json_text(document: Any) -> str:
    """JSON of a mutated document; the nan/inf markers become the bare literals Python's json reads."""
    text = json.dumps(document, default=str)
    for marker, literal in ((_NAN, "NaN"), (_INF, "Infinity"), (_NINF, "-Infinity")):
        text = text.replace(json.dumps(marker), literal)
    return text


PROFILES = [_json(DATA / "speculation-profiles" / "eagle3-k3.json"), _json(DATA / "speculation-profiles" /
                                                                            "dflash-k3.json")]
INFERENCEX_ROWS = _json(DATA / "inferencex" / "rows.json")
INFERENCEX_FLAT = [_json(path) for path in sorted((DATA / "inferencex" / "runner").glob("*.json"))[:3]]
VLLM_SERVED = [_json(DATA / "served-cpu" / name) for name in ("k4_c4_r0.json", "nosd_p40_r0.json")]
GUIDELLM_REPORT = _json(DATA / "guidellm-cpu" / "gl-concurrent8.json")
CSV_HEADER = "request_rate_rps,draft_length,acceptance,prompt_tokens,output_tokens,mean_e2e_latency_s"


@st.composite
def field_cases(draw: st.DrawFn) -> Case:
    """SD inputs from the field and their siblings: speculation profiles, InferenceX rows, GuideLLM SD metrics,
    vLLM files with failed requests and an empty goodput, CSV fields over 128 KiB, huge simulated prompts."""
    kind = draw(st.sampled_from(["profile", "profile", "inferencex", "inferencex", "guidellm", "vllm", "vllm",
                                 "csv", "simulate"]))
    if kind == "profile":
        document: Any = draw(mutated_document(PROFILES))
        if draw(st.booleans()):
            document = draw(st.sampled_from([[document], "1.0", None, {"schema_version": "1.0"}]))
        files = {"p.json": draw(file_bytes(_json_text(document)))}
        command = draw(st.sampled_from(["plan", "check", "capacity", "simulate"]))
        argv = [command]
        if draw(st.integers(0, 3)) == 0:
            files["workload.toml"] = draw(st.sampled_from([
                b'schema_version = 1\nslos = ["e2e:mean<=30s"]\n[traffic]\nrequest_rate_rps = 1.0\n'
                b'target_rate_rps = 4.0\n[acceptance]\nprofile = "p.json"\n',
                b'schema_version = 1\n[acceptance]\nprofile = "missing.json"\n',
                b'schema_version = 1\n[acceptance]\nprofile = 3\n']))
            argv += ["-w", "workload.toml"] if command in ("check", "capacity") else ["--acceptance-profile", "p.json"]
        else:
            argv += ["--acceptance-profile", draw(st.sampled_from(["p.json", "p.json", "p.json", ".", "adir",
                                                                   "nonexistent.json", ""]))]
        if command == "check":
            argv += ["--rate", draw(number_text(0, 30)), "--slo", "e2e:mean<=30s"]
        elif command == "capacity":
            argv += ["--target-rate", draw(number_text(0, 100)), "--slo", "e2e:mean<=30s"]
        elif command == "simulate":
            argv += ["-r", "1", "--requests", "50", "--seeds", "1"]
        argv += _options(draw, {"-k": DRAFT_LENGTHS, "--acceptance": ALPHAS, "-f": st.sampled_from(["json", "table"]),
                                "--draft-length": st.sampled_from(["3", "2", "best", "off"]) if command == "check"
                                or command == "simulate" else None}, most=2)
        return Case(argv=argv, files=files, output=None, fmt="table")
    if kind == "simulate":
        argv = ["simulate", "-r", draw(st.sampled_from(["4", "1", "0.01", "1,4", "40"])),
                "--prompt-tokens", draw(st.sampled_from(["100000000", "99999999", "50000000", "8192", "1"])),
                "--output-tokens", draw(st.sampled_from(["1", "2", "512", "100000", "100000000"])),
                "--requests", draw(st.sampled_from(["10", "200", "2000"])),
                "--seeds", draw(st.sampled_from(["1", "2"])),
                "--draft-length", draw(st.sampled_from(["best", "goodput", "off", "4"]))]
        argv += _options(draw, {"--max-num-batched-tokens": st.sampled_from(["1", "256", "8192"]),
                                "--max-num-seqs": st.sampled_from(["1", "8", "256"]),
                                "--kv-cache-tokens": st.sampled_from(["1e9", "1e12", "inf"]),
                                "--arrival-cv": st.sampled_from(["1", "4"]), "-f": st.sampled_from(["json"])}, most=3)
        return Case(argv=argv, output=None, fmt="table")
    if kind == "inferencex":
        rows = [draw(mutated_document(INFERENCEX_ROWS + INFERENCEX_FLAT)) for _ in range(draw(st.integers(1, 4)))]
        text = _json_text(rows if draw(st.booleans()) else rows[0])
        name = draw(st.sampled_from(["r.json", "r.json:k=4", "r.json:k=2,len=2.5"]))
    elif kind == "guidellm":
        report = copy.deepcopy(GUIDELLM_REPORT)
        metrics = report["benchmarks"][0]["metrics"]
        for metric in draw(st.lists(st.sampled_from(["iter_tokens_per_iteration", "output_tokens_per_iteration"]),
                                    max_size=2, unique=True)):
            metrics[metric] = draw(st.one_of(
                st.builds(lambda mean: {"successful": {"mean": mean}}, st.one_of(st.sampled_from(
                    [1.0, 1.05, 1.2, 2.95, 5.0, 64.0, 0.0, -1.0, 1e308]), VALUES)), VALUES))
        text = _json_text(report)
        name = draw(st.sampled_from(["r.json", "r.json", "r.json:k=4", "r.json:k=1", "r.json:k=0"]))
    elif kind == "vllm":
        document = copy.deepcopy(draw(st.sampled_from(VLLM_SERVED)))
        total = document["num_prompts"]
        done = draw(st.sampled_from([0, 1, 2, total // 10, total // 2, total - 1, total]))
        document.update({"request_goodput": draw(st.sampled_from([{}, None, [], {"x": 1}, 0])), "completed": done,
                         "failed": total - done})
        if draw(st.booleans()):
            document["errors"] = ["Server error"] * (total - done) + [""] * done
        text = _json_text(draw(mutated_document([document])))
        name = "r.json"
    else:
        size = draw(st.sampled_from([10, 1000, 131_072, 131_073, 200_000]))
        field_text = draw(st.sampled_from(["1", "x", '"', "\n", ","])) * size
        row = ["1", "0", "0.7", "100", "100", "1"]
        row[draw(st.integers(0, 5))] = field_text
        header = CSV_HEADER if draw(st.booleans()) else CSV_HEADER + field_text
        text = header + "\n" + ",".join(row) + "\n"
        name = "r.csv"
    files = {name.split(":")[0]: draw(file_bytes(text))}
    command = draw(st.sampled_from(["fit", "fit", "validate"]))
    argv = [command, *_options(draw, {"--input-format": st.sampled_from(["auto", "inferencex", "guidellm", "vllm",
                                                                         "csv"]),
                                      "--draft-length": st.sampled_from(["0", "2", "4"]),
                                      "--acceptance": st.sampled_from(["0.7", "0.99"]),
                                      "-f": st.sampled_from(["json", "table"])}, most=2), name]
    if command == "fit":
        argv += ["-o", "fit.toml"]
    return Case(argv=argv, files=files, output="fit.toml" if command == "fit" else None, fmt="toml")


# ----------------------------------------------------------------------------- running one input


class TimeLimitExceeded(BaseException):
    """Raised by the alarm when one input runs past its time limit (BaseException: not mapped to exit 70)."""


@dataclass
class Outcome:
    case: Case
    exit_code: int
    seconds: float
    problems: list[str]
    stderr: str


def _prepare(folder: Path, case: Case) -> None:
    (folder / "adir").mkdir()
    # devices only through links in the case's folder: were a regression to replace its target instead of
    # writing to it, it would replace the link, never the machine's /dev/null
    for name in ("full", "null"):
        device = Path("/dev") / name
        if device.exists() and stat.S_ISCHR(device.stat().st_mode):
            (folder / name).symlink_to(device)
    locked = folder / "locked"
    locked.mkdir()
    (locked / "cal.toml").write_bytes(case.files.get("cal.toml", b""))
    (folder / "existing.json").write_text("OLD\n")
    for name, data in case.files.items():
        (folder / name).write_bytes(data)
    locked.chmod(0)


def _leftovers(folder: Path) -> list[str]:
    found = []
    for path in folder.rglob("*"):
        if path.name.startswith(".") and path.name.endswith(".tmp"):
            found.append(str(path.relative_to(folder)))
    return found


def run_case(case: Case, time_limit_s: float, root: Path) -> Outcome:
    """Run one input in a fresh folder under ``root`` and list what breaks the property."""
    from click.testing import CliRunner

    from sdplan.cli import cli

    runner = CliRunner()
    problems: list[str] = []
    import tempfile

    home = os.getcwd()
    with tempfile.TemporaryDirectory(dir=root) as name:
        folder = Path(name)
        os.chdir(folder)  # the case names its files relative to its folder
        try:
            return _run_in(folder, case, time_limit_s, runner, cli, problems)
        finally:
            os.chdir(home)
            (folder / "locked").chmod(stat.S_IRWXU)


def _run_in(folder: Path, case: Case, time_limit_s: float, runner: Any, cli: Any, problems: list[str]) -> Outcome:
    _prepare(folder, case)
    existing = (folder / "existing.json").read_bytes()

    def alarm(signum: int, frame: Any) -> None:
        raise TimeLimitExceeded()

    previous = signal.signal(signal.SIGALRM, alarm)
    signal.setitimer(signal.ITIMER_REAL, time_limit_s)
    start = time.perf_counter()
    try:
        result = runner.invoke(cli, case.argv, env={"NO_COLOR": "1", "COLUMNS": "200", **case.env},
                               catch_exceptions=True, prog_name="sdplan")
        exit_code, stdout, stderr, exception = result.exit_code, result.stdout, result.stderr, result.exception
    except TimeLimitExceeded:
        exit_code, stdout, stderr, exception = -1, "", "", None
        problems.append(f"no answer within {time_limit_s:g} s")
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        seconds = time.perf_counter() - start
        (folder / "locked").chmod(stat.S_IRWXU)
    if exit_code != -1:
        if exit_code == ExitStatus.INTERNAL:
            problems.append("exit 70 (internal error)")
        elif exit_code not in DOCUMENTED:
            problems.append(f"undocumented exit status {exit_code}")
        if exception is not None and not isinstance(exception, SystemExit):
            problems.append(f"uncaught {type(exception).__name__}: {exception}")
        if "Traceback" in stdout or "Traceback" in stderr:
            problems.append("traceback in the output")
    leftovers = _leftovers(folder)
    if leftovers:
        problems.append(f"temporary files left behind: {leftovers}")
    if case.output == "existing.json":
        now = (folder / "existing.json").read_bytes()
        if exit_code in FAILED_EARLY and now != existing:
            problems.append(f"exit {exit_code} but existing.json was changed")
        if now != existing and case.fmt == "json":
            try:
                json.loads(now)
            except ValueError:
                problems.append("existing.json is not complete JSON")
    elif case.output and case.fmt == "json" and not case.output.startswith("/"):
        written = folder / case.output
        try:
            data = written.read_bytes() if written.is_file() else None
        except OSError:  # a name the file system refuses: nothing was written
            data = None
        if data is not None:
            try:
                json.loads(data)
            except ValueError as error:
                problems.append(f"{case.output} is not complete JSON ({error})")
    return Outcome(case=case, exit_code=exit_code, seconds=seconds, problems=problems, stderr=stderr)


def no_warnings_escape() -> None:
    """Turn warnings into errors (as pytest does), so that a numpy warning shows up as exit 70."""
    import warnings

    warnings.simplefilter("error")


def environment_ok() -> bool:
    """The property needs SIGALRM (POSIX) to bound time."""
    return hasattr(signal, "setitimer") and os.name == "posix"


# ----------------------------------------------------------------------------- the long run


def main() -> int:
    """The long run: >= 10^4 inputs, figures printed (exit status 1 if any input broke the property)."""
    import argparse
    import collections
    import resource
    import sys
    import tempfile

    from hypothesis import HealthCheck, Phase, given, seed, settings

    parser = argparse.ArgumentParser(description=LONG_RUN)
    parser.add_argument("-n", "--inputs", type=int, default=10_000, help="inputs to run (default 10000)")
    parser.add_argument("--seed", type=int, default=0, help="hypothesis seed (default 0)")
    parser.add_argument("--time-limit", type=float, default=60.0, help="seconds allowed per input (default 60)")
    parser.add_argument("--large", action="store_true",
                        help="simulations at their default sizes (seconds each) instead of the suite's small ones")
    parser.add_argument("--plots", action="store_true", help="also write figures (--plot-file; slower)")
    parser.add_argument("--readers", action="store_true",
                        help="also mutate benchmark result files and speculation profiles")
    parser.add_argument("--show", type=int, default=5, help="failing inputs shown per problem (default 5)")
    args = parser.parse_args()
    no_warnings_escape()

    outcomes: list[Outcome] = []
    strategies = [cases(small=not args.large, plots=args.plots), focused_cases()]
    strategy = (st.one_of(*strategies, reader_cases(), field_cases()) if args.readers
                else st.one_of(*strategies))
    started = time.perf_counter()
    root = Path(tempfile.mkdtemp(prefix="sdplan-fuzz-"))

    @settings(max_examples=args.inputs, deadline=None, database=None, derandomize=False,
              suppress_health_check=list(HealthCheck), phases=[Phase.generate])
    @given(case=strategy)
    def run(case):  # type: ignore[no-untyped-def]
        outcome = run_case(case, args.time_limit, root)
        outcomes.append(outcome)
        if len(outcomes) % 1000 == 0:
            print(f"  {len(outcomes):,} inputs, {time.perf_counter() - started:.0f} s", file=sys.stderr, flush=True)

    seed(args.seed)(run)()
    elapsed = time.perf_counter() - started

    exits = collections.Counter(outcome.exit_code for outcome in outcomes)
    times = sorted(outcome.seconds for outcome in outcomes)
    commands = collections.Counter(outcome.case.argv[0] for outcome in outcomes)
    problems: dict[str, list[Outcome]] = collections.defaultdict(list)
    for outcome in outcomes:
        for problem in outcome.problems:
            problems[problem.split(":")[0][:80]].append(outcome)

    def pct(q: float) -> float:
        return times[min(len(times) - 1, int(q * len(times)))]

    print(f"inputs: {len(outcomes):,} in {elapsed:.0f} s "
          f"(seed {args.seed}, time limit {args.time_limit:g} s per input)")
    print("commands: " + ", ".join(f"{name} {count}" for name, count in commands.most_common()))
    print("exit statuses: " + ", ".join(f"{code}: {count}" for code, count in sorted(exits.items())))
    print(f"seconds per input: median {pct(0.5):.3f}, p90 {pct(0.9):.3f}, p99 {pct(0.99):.3f}, max {times[-1]:.2f}; "
          f"over 30 s: {sum(1 for t in times if t > 30)}; exit 70: {exits.get(70, 0)}")
    print(f"peak memory of this process: {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MiB")
    print("slowest inputs:")
    for outcome in sorted(outcomes, key=lambda o: -o.seconds)[:5]:
        print(f"  {outcome.seconds:6.2f} s  exit {outcome.exit_code}  {str(outcome.case)[:160]}")
    failing = sum(1 for outcome in outcomes if outcome.problems)
    print(f"inputs breaking the property: {failing}")
    for problem, found in sorted(problems.items(), key=lambda item: -len(item[1])):
        print(f"  {len(found)} x {problem}")
        for outcome in found[: args.show]:
            print(f"      {str(outcome.case)[:200]}")
            print(f"        -> {outcome.stderr.strip().splitlines()[-1][:200] if outcome.stderr.strip() else ''}")
    return 1 if failing else 0


if __name__ == "__main__":
    raise SystemExit(main())
