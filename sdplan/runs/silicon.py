"""Reading NVIDIA AIConfigurator's measured silicon rows (``silicon_sample.csv``).

AIConfigurator (Apache-2.0; the ``aiconfigurator-core`` package, 0.12.0) ships
``aiconfigurator_core/systems/silicon_sample.csv``: end-to-end measurements of
serving engines on GPUs, one row per (model, system, backend and version,
parallelism, precision, prompt length ``isl``, output length ``osl``,
concurrency ``batch_size``). Each aggregated (``mode = agg``) row is a closed
loop of ``N = batch_size`` clients at fixed lengths, and records the mean time
to first token ``silicon_ttft_ms`` and the mean time per output token
``silicon_tpot_ms``. No row speculates (draft length 0).

Each row becomes one :class:`~sdplan.runs.record.BenchmarkRun`: a closed loop of
``N`` clients (``B = N - 1`` others in flight), ``p = isl``, ``g = osl`` and
the mean end-to-end latency from vLLM's definition of TPOT,
``TPOT = (E2E - TTFT)/(g - 1)``, so ``E2E = TTFT + (g - 1) TPOT``
(``vllm/benchmarks/serve.py``; the same relation as
:func:`sdplan.latency.model.time_per_output_token`). Disaggregated rows (separate
prefill and decode workers) are not one replica and are not read.

One file holds many configurations and a calibration is for one: a
:class:`Selection` (``sdplan fit/validate --select model=Qwen3-32B,tp=4``)
keeps the rows of one configuration, and names the values to choose from when
it matches none or several.

The file lists some runs under several ids, some of them rounded (Qwen3.5-397B-A17B on
4x B200 at 1024/1024 and 4 clients: 338.3364 / 6.3327 ms under ids 463 and 1911, 338.34 /
6.33 under a gap-analysis id). A measurement is one run however often it is listed
(:func:`distinct_measurements`), so a fit does not weigh it twice.
"""

from __future__ import annotations

import csv
import importlib.util
import math
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from sdplan.errors import InputFileError, InvalidValueError, MissingDependencyError
from sdplan.runs.record import BenchmarkRun, read_text

#: How :mod:`sdplan.runs.read` names this format (``--input-format aic-silicon``) and describes it in errors.
NAME = "aic-silicon"
DESCRIPTION = "an AIConfigurator silicon_sample.csv"
#: This reader takes a :class:`Selection` (``--select``): one file holds many configurations.
SELECTS = True
#: Columns every silicon-sample file has; the first four identify the format.
REQUIRED_COLUMNS = ("silicon_ttft_ms", "silicon_tpot_ms", "isl", "osl", "batch_size", "mode", "model_path",
                    "system", "backend", "backend_version", "tp_size", "precision")
#: The argument that names the packaged file of an installed ``aiconfigurator-core``.
PACKAGED = "aic:silicon_sample"
#: What installs it.
INSTALL_LINE = "pip install 'aiconfigurator-core==0.12.0'"
#: Selection keys in the order they are applied and shown, with the CSV column each reads.
KEYS = {"model": "model_path", "system": "system", "backend": "backend", "version": "backend_version",
        "tp": "tp_size", "precision": "precision", "quant": "gemm_quant_mode", "dp": "attention_dp_size",
        "moe_tp": "moe_tp_size", "moe_ep": "moe_ep_size"}
#: A Prometheus label name (the data model's ``[a-zA-Z_][a-zA-Z0-9_]*``): any of them picks a server of a metrics
#: file with ``--select``, except the silicon keys above.
LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
#: What a blank cell reads as.
UNRECORDED = "unrecorded"
#: Two rows of one configuration at the same lengths and concurrency whose TTFT and TPOT both agree within this
#: share are one measurement listed twice (:func:`distinct_measurements`); repeated runs of a benchmark differ
#: by more (0.1% reads the same repeats on the packaged file but for 8 rounded ones).
SAME_MEASUREMENT = 5e-3
#: A closed loop whose mean TTFT is over this multiple of the TTFT at the lowest concurrency measured at the same
#: lengths had requests waiting for admission (a full KV cache or batch): the issue's definition of rows "where
#: the KV cache binds" (``benchmarks/RESULTS-accuracy-silicon-2026-11.md``), :func:`waited_for_admission`.
ADMISSION_WAIT_TTFT_RATIO = 5.0


def is_silicon_header(columns: list[str] | tuple[str, ...]) -> bool:
    """Whether a CSV header is AIConfigurator's silicon-sample format."""
    return all(name in columns for name in ("silicon_ttft_ms", "silicon_tpot_ms", "isl", "osl", "batch_size"))


def header(text: str) -> list[str]:
    """The column names of a CSV text's first line (none where it is not CSV, e.g. a bare carriage return)."""
    try:
        return [column.strip() for column in next(csv.reader([text[:1 << 16].split("\n", 1)[0]]), [])]
    except csv.Error:
        return []


def detects(path: Path, text: str) -> bool:
    """Whether a file is a silicon sample: by its header, whatever its name."""
    return is_silicon_header(header(text))


def read(where: str, text: str, selection: Selection | None = None) -> tuple[list[BenchmarkRun], list[str]]:
    """The runs of the configuration ``selection`` picks (see :func:`read_silicon`), and notes."""
    runs, _, notes = read_silicon(where, text, selection or Selection())
    return runs, notes


def resolve_path(argument: str) -> Path:
    """The file an argument names: :data:`PACKAGED` is the installed package's own CSV.

    Raises
    ------
    MissingDependencyError
        For :data:`PACKAGED` when ``aiconfigurator-core`` is not installed (exit 5).
    """
    if argument != PACKAGED:
        return Path(argument)
    spec = importlib.util.find_spec("aiconfigurator_core")  # finds the package without importing it
    folders = list(spec.submodule_search_locations or []) if spec is not None else []
    for folder in folders:
        path = Path(folder) / "systems" / "silicon_sample.csv"
        if path.is_file():
            return path
    raise MissingDependencyError(f"{PACKAGED}: AIConfigurator's measured rows are not installed; {INSTALL_LINE} "
                                 "(Apache-2.0), or give the path of a silicon_sample.csv")


@dataclass(frozen=True, slots=True)
class Selection:
    """``key=value`` filters on a silicon file's rows (:data:`KEYS`); empty keeps every row."""

    filters: tuple[tuple[str, str], ...] = ()
    #: Labels that pick a server of a metrics file: any Prometheus label name but the silicon keys, as given.
    labels: tuple[tuple[str, str], ...] = ()

    @classmethod
    def parse(cls, texts: tuple[str, ...] | list[str]) -> Selection:
        """``("model=Qwen3-32B,tp=4", "system=h100_sxm")`` -> a selection (a key given twice is an error).

        A key is a silicon key (:data:`KEYS`, any case, ``-`` for ``_``) or else a Prometheus label name
        (:data:`LABEL_NAME`, case kept; ``-``, which no label name has, read as ``_``).

        Raises
        ------
        InvalidValueError
            On a malformed item, or a key that is neither (exit 2).
        """
        filters: dict[str, str] = {}
        labels: dict[str, str] = {}
        for text in texts:
            for item in text.split(","):
                if not item.strip():
                    continue
                written, eq, value = item.partition("=")
                written, value = written.strip().replace("-", "_"), value.strip()
                if not eq or not value:
                    raise InvalidValueError(f"--select {item.strip()!r}: expected KEY=VALUE, e.g. model=Qwen3-32B")
                key = written.lower()
                if key not in KEYS and LABEL_NAME.fullmatch(written):
                    if written in labels and labels[written] != value:
                        raise InvalidValueError(f"--select: {written} given twice ({labels[written]}, {value}); "
                                                "give one")
                    labels[written] = value
                    continue
                if key not in KEYS:
                    raise InvalidValueError(f"--select {item.strip()!r}: {written!r} is neither a silicon key "
                                            f"({', '.join(KEYS)}) nor a Prometheus label name (letters, digits "
                                            "and _, not first a digit)")
                if key in filters and filters[key] != value:
                    raise InvalidValueError(f"--select: {key} given twice ({filters[key]}, {value}); give one")
                filters[key] = value
        return cls(tuple((key, filters[key]) for key in KEYS if key in filters), tuple(labels.items()))

    def __bool__(self) -> bool:
        return bool(self.filters or self.labels)

    def describe(self) -> str:
        return ",".join(f"{key}={value}" for key, value in (*self.filters, *self.labels))


def cell_value(row: dict[str, str], key: str) -> str:
    """A row's value of a selection key, normalised for display and matching."""
    raw = (row.get(KEYS[key]) or "").strip()
    if key in ("tp", "dp", "moe_tp", "moe_ep"):
        if not raw:
            return "1"
        try:
            number = float(raw)
        except ValueError:
            return raw
        return str(int(number)) if number == int(number) else raw
    if key == "quant":
        moe = (row.get("moe_quant_mode") or "").strip()
        gemm = raw or UNRECORDED
        return gemm if not moe or moe == raw else f"{gemm}/{moe}"
    return raw or UNRECORDED


def _matches(key: str, cell: str, wanted: str) -> bool:
    cell_l, wanted_l = cell.lower(), wanted.lower()
    if cell_l == wanted_l:
        return True
    if key == "model":  # Qwen3-32B matches Qwen/Qwen3-32B
        return cell_l.rpartition("/")[2] == wanted_l
    if key == "system":  # h100 matches h100_sxm
        return cell_l.partition("_")[0] == wanted_l
    return False


def _values(rows: list[dict[str, str]], key: str) -> list[str]:
    return sorted({cell_value(row, key) for row in rows}, key=lambda v: (len(v) if v.isdigit() else 0, v.lower()))


@dataclass(frozen=True, slots=True)
class SiliconConfiguration:
    """The configuration the selected rows measured (for provenance)."""

    model: str
    system: str
    backend: str
    version: str
    tp: int
    precision: str
    quant: str
    dp: int
    moe_tp: int
    moe_ep: int

    @property
    def hardware(self) -> str:
        """``4x h100_sxm`` (GPUs per replica and AIConfigurator's system name)."""
        return f"{self.tp * self.dp}x {self.system}"

    def describe(self) -> str:
        parallel = f"TP {self.tp}" + (f", attention DP {self.dp}" if self.dp > 1 else "") + (
            f", MoE TP {self.moe_tp} EP {self.moe_ep}" if self.moe_ep > 1 or self.moe_tp not in (1, self.tp) else "")
        precision = ("precision not recorded" if self.precision == UNRECORDED else f"precision {self.precision}"
                     + (f" ({self.quant})" if self.quant not in (UNRECORDED, self.precision) else ""))
        version = "(version not recorded)" if self.version == UNRECORDED else self.version
        return f"{self.model} on {self.system}, {self.backend} {version}, {parallel}, {precision}"


def select_rows(name: str, rows: list[tuple[int, dict[str, str]]],
                selection: Selection) -> list[tuple[int, dict[str, str]]]:
    """The rows of the one configuration ``selection`` picks.

    Raises
    ------
    InputFileError
        When a filter matches no row (the message lists the values there are,
        given the filters before it) or the rows left span several
        configurations (it lists the keys that differ and their values).
    """
    kept = rows
    for key, wanted in selection.filters:
        matching = [(line, row) for line, row in kept if _matches(key, cell_value(row, key), wanted)]
        if not matching:
            earlier = selection.filters[:selection.filters.index((key, wanted))]
            before = f" with {','.join(f'{k}={v}' for k, v in earlier)}" if earlier else ""
            raise InputFileError(name, f"--select {key}={wanted}",
                                 f"matches no aggregated row{before}; {key} is one of "
                                 f"{', '.join(_values([row for _, row in kept], key))}")
        kept = matching
    differing = [key for key in KEYS if len({cell_value(row, key) for _, row in kept}) > 1]
    if differing:
        shown = "; ".join(f"{key}: {', '.join(_values([row for _, row in kept], key))}" for key in differing)
        given = f"--select {selection.describe()} matches" if selection else "holds"
        raise InputFileError(name, None, f"{given} {len({tuple(cell_value(r, k) for k in KEYS) for _, r in kept})} "
                                         f"configurations and a calibration is for one; narrow it with --select "
                                         f"({shown})")
    return kept


def configuration_of(rows: list[dict[str, str]]) -> SiliconConfiguration:
    """The configuration of rows :func:`select_rows` returned (one)."""
    row = rows[0]
    return SiliconConfiguration(model=cell_value(row, "model"), system=cell_value(row, "system"),
                                backend=cell_value(row, "backend"),
                                version=cell_value(row, "version"), tp=int(cell_value(row, "tp")),
                                precision=cell_value(row, "precision"), quant=cell_value(row, "quant"),
                                dp=int(cell_value(row, "dp")), moe_tp=int(cell_value(row, "moe_tp")),
                                moe_ep=int(cell_value(row, "moe_ep")))


def _positive(name: str, line: int, row: dict[str, str], column: str) -> float:
    raw = (row.get(column) or "").strip()
    try:
        value = float(raw)
    except ValueError:
        raise InputFileError(name, f"line {line}: {column}", f"expected a number, got {raw[:40]!r}") from None
    if not math.isfinite(value) or value <= 0:
        raise InputFileError(name, f"line {line}: {column}", f"must be a finite number > 0, got {raw}")
    return value


def parse_rows(name: str, text: str) -> list[tuple[int, dict[str, str]]]:
    """The aggregated rows of a silicon-sample file, with their line numbers.

    Raises
    ------
    InputFileError
        On a missing column or a file without aggregated rows.
    """
    reader = csv.DictReader(text.splitlines())
    try:
        columns = reader.fieldnames or []
        missing = [column for column in REQUIRED_COLUMNS if column not in columns]
        if missing:
            raise InputFileError(name, missing[0], "missing column; an AIConfigurator silicon_sample.csv has "
                                                   + ", ".join(REQUIRED_COLUMNS))
        rows = [(line, row) for line, row in enumerate(reader, start=2) if (row.get("mode") or "").strip() == "agg"]
    except csv.Error as error:  # a field over 128 KiB, a stray carriage return
        raise InputFileError(name, None, f"not valid CSV ({str(error)[:120]})") from None
    if not rows:
        raise InputFileError(name, "mode", "no aggregated (mode = agg) rows; disaggregated serving is not one "
                                           "replica and is not read")
    return rows


def run_of(name: str, line: int, row: dict[str, str]) -> BenchmarkRun:
    """One aggregated row as a closed-loop run (see the module notes for the E2E relation).

    Raises
    ------
    InputFileError
        On a missing, non-positive or fractional count or time.
    """
    prompt = _positive(name, line, row, "isl")
    output = _positive(name, line, row, "osl")
    clients = _positive(name, line, row, "batch_size")
    if clients != int(clients):
        raise InputFileError(name, f"line {line}: batch_size", f"expected a whole number of clients, got "
                                                               f"{clients:g}")
    ttft = _positive(name, line, row, "silicon_ttft_ms") / 1e3
    tpot = _positive(name, line, row, "silicon_tpot_ms") / 1e3
    latency = ttft + (output - 1.0) * tpot
    return BenchmarkRun(
        source=f"{Path(name).name}:{line}", requested_rate_rps=None, achieved_rate_rps=clients / latency,
        concurrency=int(clients), draft_length=0, alpha=None, prompt_tokens=prompt, output_tokens=output,
        mean_e2e_latency_s=latency, mean_ttft_s=ttft, mean_tpot_s=tpot,
        records_draft_length=True, records_acceptance=True,
    )


def read_silicon(name: str, text: str,
                 selection: Selection) -> tuple[list[BenchmarkRun], SiliconConfiguration, list[str]]:
    """Runs of the configuration ``selection`` picks from a silicon-sample file, and notes.

    Returns
    -------
    (runs, configuration, notes)
        One closed-loop :class:`~sdplan.runs.record.BenchmarkRun` per row (see the
        module notes for the E2E relation).
    """
    rows = select_rows(name, parse_rows(name, text), selection)
    configuration = configuration_of([row for _, row in rows])
    runs, repeated = distinct_measurements([run_of(name, line, row) for line, row in rows])
    notes = [f"{repeated} of {len(rows)} rows repeat a measurement another row lists (the same lengths and "
             f"concurrency, TTFT and TPOT within {100 * SAME_MEASUREMENT:g}%): counted once"] if repeated else []
    return runs, configuration, notes


def distinct_measurements(runs: list[BenchmarkRun]) -> tuple[list[BenchmarkRun], int]:
    """The runs with every repeat of a measurement left out (:data:`SAME_MEASUREMENT`), and how many were."""
    kept: list[BenchmarkRun] = []
    for run in runs:
        if not any((r.prompt_tokens, r.output_tokens, r.concurrency) == (run.prompt_tokens, run.output_tokens,
                                                                         run.concurrency)
                   and _agree(run.mean_ttft_s, r.mean_ttft_s) and _agree(run.mean_tpot_s, r.mean_tpot_s)
                   for r in kept):
            kept.append(run)
    return kept, len(runs) - len(kept)


def waited_for_admission(runs: list[BenchmarkRun] | tuple[BenchmarkRun, ...]) -> list[bool]:
    """Per closed-loop run, whether its requests waited for admission (:data:`ADMISSION_WAIT_TTFT_RATIO`).

    Notes
    -----
    A closed loop of ``N`` clients whose requests wait for a KV-cache or batch slot does not run ``N``
    sequences a step: Little's law puts ``N (E2E - TTFT) / E2E`` of them in the running batch, and the
    wait lands in TTFT. AIConfigurator's rows show it as TTFTs of seconds to minutes beside TPOTs no
    larger than at a quarter of the clients (gpt-oss-120b on 2x H100, 1024/1024: 59 ms at 4 clients,
    23.8 s at 512). A run is compared with the lowest concurrency of the same prompt and output lengths
    among ``runs``; that run itself, and a run without a TTFT, is never flagged.
    """
    floor = {shape: run.mean_ttft_s for shape, run in lowest_concurrency_runs(runs).items()
             if run.mean_ttft_s is not None}
    return [run.mean_ttft_s is not None
            and run.mean_ttft_s > ADMISSION_WAIT_TTFT_RATIO * floor[(run.prompt_tokens, run.output_tokens)]
            for run in runs]


def lowest_concurrency_runs(runs: Iterable[BenchmarkRun]) -> dict[tuple[float, float], BenchmarkRun]:
    """Per (prompt, output) length, the run with a TTFT at the fewest clients (the first listed of equals)."""
    lowest: dict[tuple[float, float], BenchmarkRun] = {}
    for run in runs:
        shape = (run.prompt_tokens, run.output_tokens)
        if run.mean_ttft_s is not None and (shape not in lowest
                                            or (run.concurrency or 0) < (lowest[shape].concurrency or 0)):
            lowest[shape] = run
    return lowest


def _agree(value: float | None, other: float | None) -> bool:
    return value is not None and other is not None and other > 0 and abs(value / other - 1.0) <= SAME_MEASUREMENT


def configuration_in(path: Path, input_format: str, selection: Selection) -> SiliconConfiguration | None:
    """The configuration ``selection`` picks from ``path`` if it is a silicon file (else None).

    Used for a fitted calibration's provenance; the rows themselves come from
    :func:`read_silicon` through the results reader.
    """
    if path.is_dir() or input_format not in ("auto", NAME):
        return None
    if input_format == "auto":  # by the head first: other formats' files may be compressed, or gigabytes
        with path.open("rb") as stream:
            head = stream.read(1 << 16)
        if not head.startswith((b"\xff\xfe", b"\xfe\xff")) and not detects(path, head.decode("utf-8-sig", "replace")):
            return None
    text = read_text(path)
    if input_format == "auto" and not detects(path, text):
        return None
    return configuration_of([row for _, row in select_rows(str(path), parse_rows(str(path), text), selection)])


def provenance(configuration: SiliconConfiguration, path: Path) -> dict[str, object]:
    """Provenance fields of a calibration fitted to a configuration's measured rows."""
    return {
        "hardware": configuration.hardware, "target_model": configuration.model, "engine": configuration.backend,
        "engine_version": "unknown" if configuration.version == UNRECORDED else configuration.version,
        "tensor_parallel_size": configuration.tp,
        **({"dtype": configuration.precision} if configuration.precision != UNRECORDED else {}),
        "assumptions": [(f"measured rows of {configuration.describe()} from NVIDIA AIConfigurator's "
                         f"{path.name} (Apache-2.0): closed loops of N clients, mean E2E = TTFT + (output - 1) x "
                         "TPOT")],
    }
