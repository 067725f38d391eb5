"""Measured runs: benchmark result files read into one record, screened for the fit.

Every format is normalised into :class:`BenchmarkRun` records in SI units
(seconds, requests per second), so fits and validations never see a unit or
a field name of the source.

Modules, each importing only those above it in this list:

* :mod:`~sdplan.runs.record`: :class:`BenchmarkRun`, the number helpers every
  reader shares, and the load each request saw (:func:`others_in_flight`).
* :mod:`~sdplan.runs.screen`: the per-request measures of the steady-state
  screen (:func:`kept_up_fraction`, :func:`held_back`); the screen itself is
  the core's :func:`sdplan.fitting.steady_state.screen`, exported here for the readers'
  callers.
* one module per input format: :mod:`~sdplan.runs.vllm_bench` (``vllm bench
  serve`` and ``vllm bench sweep``), :mod:`~sdplan.runs.guidellm` (GuideLLM
  reports), :mod:`~sdplan.runs.silicon` (NVIDIA AIConfigurator's measured
  ``silicon_sample.csv``), :mod:`~sdplan.runs.inferencex` (InferenceX benchmark
  rows) and :mod:`~sdplan.runs.csv` (plain CSV).
* :mod:`~sdplan.runs.facts`: draft length and acceptance given per file
  (``FILE:k=4,len=2.8``) or by flags, for files that do not record them.
* :mod:`~sdplan.runs.manifest`: the manifest ``sdplan calibrate`` writes
  beside its results (which points it flagged overloaded).
* :mod:`~sdplan.runs.read`: the format registry, detection, and
  :func:`read_results` / :func:`load_runs` for files and folders.

Adding an input format
----------------------
Write one module here with

* ``NAME``: its ``--input-format`` value; ``DESCRIPTION``: how the error for
  an unrecognised file names it (e.g. ``"a GuideLLM report"``);
* ``detects(path, content) -> bool``: whether ``auto`` should read the file
  with it (``content`` is the file's text for a text format, one decoded JSON
  object for a JSON format); it must not claim another format's files;
* ``read(where, content) -> (runs, warnings)``: the :class:`BenchmarkRun`
  records, raising :class:`~sdplan.errors.InputFileError` naming ``where``
  and the field for anything malformed. Use :func:`~sdplan.runs.record.number`,
  :func:`~sdplan.runs.record.optional_number` and
  :func:`~sdplan.runs.record.count` for fields, and fill in what the screen
  needs (closed or open loop, failures, per-request times where there are).
  A file that holds many configurations, of which a calibration is for one,
  sets ``SELECTS = True`` and takes a third argument, the
  :class:`~sdplan.runs.silicon.Selection` of ``--select`` (see
  :mod:`~sdplan.runs.silicon`); readers without it refuse a selection.

then add one entry to :data:`sdplan.runs.read.READERS`, ``_reader(module,
"json")`` or ``_reader(module, "text")``, before any reader whose ``detects``
would also claim its files (``auto`` asks text readers first, then JSON readers
in that order). Add ``NAME`` to ``--input-format``'s choices in
``sdplan/cli/_results.py`` (kept literal so that ``--help`` imports no reader;
``tests/test_fit_validate.py`` checks they equal :data:`FORMATS`), document the
format in ``man/man1/sdplan-fit.1`` and ``sdplan-validate.1``, and test it with a
real file under ``tests/data``.

GuideLLM reports in brief
-------------------------
GuideLLM v2 (``metadata.version == 2``): ``benchmarks[]`` with
``metrics.<name>.successful.mean``; ``request_latency`` in **seconds**,
``*_ms`` in ms; ``inter_token_latency_ms`` (the match for vLLM's TPOT);
``request_concurrency``; ``synchronous``/``concurrent`` strategies are closed
loops; errored requests are failures, ``incomplete`` ones (cancelled when a
time or count limit ended the run) are not. Where ``requests.successful[]``
lists every request with its ``info.timings`` (GuideLLM 0.8), the means and
the load each request saw come from them, as from vLLM's lists (checked
against real GuideLLM 0.8.1 reports, tests/data/guidellm-cpu).
"""

from sdplan.runs.facts import RunFacts, split_file_facts
from sdplan.runs.read import FORMATS, READERS, Reader, detect_format, load_runs, read_results
from sdplan.runs.record import BenchmarkRun, file_digest, is_finite_number, others_in_flight
from sdplan.runs.screen import held_back, kept_up_fraction
from sdplan.runs.vllm_bench import draft_coverage

# isort: split
# After the submodules: these names are the re-exports, not the modules.
from sdplan.fitting.steady_state import MIN_KEPT_UP_FRACTION, fell_behind, screen

__all__ = ["FORMATS", "MIN_KEPT_UP_FRACTION", "READERS", "BenchmarkRun", "Reader", "RunFacts", "detect_format",
           "draft_coverage", "fell_behind", "file_digest", "held_back", "is_finite_number", "kept_up_fraction",
           "load_runs", "others_in_flight", "read_results", "screen", "split_file_facts"]
