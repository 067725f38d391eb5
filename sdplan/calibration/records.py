"""Typed records of a calibration file, read once when the file is loaded.

The schema (:mod:`sdplan.calibration.schema`) checks each key's type and
bounds; the records here turn the checked tables into frozen records and
check what spans keys (a list that must match another's length, a covariance
that must match its parameter list). So a file that loads is consistent, and
every query reads typed values instead of the TOML dictionary.

Values keep the type the file gave where the schema allows either (an integer
where a number is expected), as the document they come from does.
"""

from __future__ import annotations

import datetime as _dt
import shlex
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from sdplan.errors import InputFileError

#: A ``[min, max]`` range of the ``[validity]`` table.
Span = tuple[float, float]


@dataclass(frozen=True, slots=True, kw_only=True)
class Provenance:
    """How, on what and with what the numbers were obtained (``[provenance]``)."""

    method: str
    hardware: str
    target_model: str
    draft_model: str
    #: The SD method the costs describe, where the file names it (:func:`sdplan.inputs.methods.calibration_method`).
    speculative_method: str | None
    engine: str
    engine_version: str
    date: _dt.date
    created_by: str | None
    dtype: str | None
    tensor_parallel_size: int | None
    assumptions: tuple[str, ...]
    sources: tuple[str, ...]
    notes: str | None

    @classmethod
    def from_table(cls, table: Mapping[str, Any], path: str) -> Provenance:
        """The record of a schema-checked ``[provenance]`` table.

        Raises
        ------
        InputFileError
            If ``date`` is a string that is not an ISO date.
        """
        date = table["date"]
        if isinstance(date, str):
            try:
                date = _dt.date.fromisoformat(date)
            except ValueError:
                raise InputFileError(path, "provenance.date", f'"{date}" is not a date; write YYYY-MM-DD') from None
        return cls(method=table["method"], hardware=table["hardware"], target_model=table["target_model"],
                   draft_model=table["draft_model"], speculative_method=table.get("speculative_method"),
                   engine=table["engine"], engine_version=table["engine_version"], date=date,
                   created_by=table.get("created_by"), dtype=table.get("dtype"),
                   tensor_parallel_size=table.get("tensor_parallel_size"),
                   assumptions=tuple(table.get("assumptions", ())), sources=tuple(table.get("sources", ())),
                   notes=table.get("notes"))


@dataclass(frozen=True, slots=True)
class ReferenceWorkload:
    """The lengths the direct-form coefficients were measured at (``[reference_workload]``), tokens."""

    prompt_tokens: int
    output_tokens: int

    @classmethod
    def from_table(cls, table: Mapping[str, Any]) -> ReferenceWorkload:
        """The record of a schema-checked ``[reference_workload]`` table."""
        return cls(table["prompt_tokens"], table["output_tokens"])


@dataclass(frozen=True, slots=True)
class Validity:
    """The ranges the calibration covers (``[validity]``); None where the file gives none."""

    prompt_tokens: Span | None = None
    output_tokens: Span | None = None
    batch_size: Span | None = None

    @classmethod
    def from_table(cls, table: Mapping[str, Any] | None) -> Validity:
        """The record of a schema-checked ``[validity]`` table, or of none."""
        table = table or {}

        def span(key: str) -> Span | None:
            value = table.get(key)
            return None if value is None else (value[0], value[1])

        return cls(span("prompt_tokens"), span("output_tokens"), span("batch_size"))


@dataclass(frozen=True, slots=True, kw_only=True)
class FitQuality:
    """How well a fitted or measured calibration fits its points (``[fit_quality]``)."""

    r2: float
    rmse_s: float | None
    mape_pct: float | None
    points: int | None
    detail: str | None

    @classmethod
    def from_table(cls, table: Mapping[str, Any]) -> FitQuality:
        """The record of a schema-checked ``[fit_quality]`` table."""
        return cls(r2=table["r2"], rmse_s=table.get("rmse_s"), mape_pct=table.get("mape_pct"),
                   points=table.get("points"), detail=table.get("detail"))


@dataclass(frozen=True, slots=True, kw_only=True)
class CalibrationAcceptance:
    """Acceptance measured together with a calibration (optional)."""

    per_token_alpha: float
    measured_at_k: int | None
    per_position_rates: tuple[float, ...] | None
    source: str
    #: Fraction of decode steps that carried a draft (1: every step drafts, as a draft model does).
    draft_coverage: float = 1.0

    @classmethod
    def from_table(cls, table: Mapping[str, Any]) -> CalibrationAcceptance:
        """The record of a schema-checked ``[acceptance]`` table."""
        rates = table.get("per_position_rates")
        return cls(per_token_alpha=float(table["per_token_alpha"]), measured_at_k=table.get("measured_at_k"),
                   per_position_rates=tuple(float(r) for r in rates) if rates is not None else None,
                   source=str(table["source"]), draft_coverage=float(table.get("draft_coverage", 1.0)))


@dataclass(frozen=True, slots=True, kw_only=True)
class ExpertRouting:
    """A mixture-of-experts target (``[moe]``): its routing and the costs of full expert coverage.

    ``coverage`` maps a coefficient name (``c1p_s``, ``baseline_c2_step_s``, ...) to the seconds it
    gains at full coverage, at the reference workload, in the file's order.
    """

    experts_per_token: int
    experts: int
    coverage: Mapping[str, float]

    @classmethod
    def from_table(cls, table: Mapping[str, Any]) -> ExpertRouting:
        """The record of a schema-checked ``[moe]`` table."""
        return cls(experts_per_token=table["experts_per_token"], experts=table["experts"],
                   coverage=dict(table.get("coverage", {})))


@dataclass(frozen=True, slots=True, kw_only=True)
class DirectCoefficients:
    """The direct form (``[coefficients]``): Kong et al.'s coefficients at the reference workload, seconds.

    The ``*_per_context_token_s`` slopes are None where the file gives none (the scaling then takes
    its defaults, :func:`sdplan.calibration.scaling.direct_coefficients_at`).
    """

    scaling: str
    c1p_s: float
    c2p_s: float
    c1_step_s: float
    c2_step_s: float
    c2_step_per_context_token_s: float | None
    #: The part of ``c2_step_s`` that does not grow with the context; 0 when absent.
    c2_step_fixed_s: float
    c1v_s: float
    c2v_s: float
    c1d_s: float
    c2d_s: float
    c2v_per_context_token_s: float | None
    c2d_per_context_token_s: float | None
    #: Serving-frontend seconds per streamed chunk (:func:`sdplan.latency.model.frontend_floor`); 0 when absent.
    frontend_chunk_s: float = 0.0
    #: The target step's compute-bound knee (:mod:`sdplan.latency.knee`); 0 when absent (no knee).
    knee_tokens: float = 0.0
    knee_per_token_s: float = 0.0
    #: ``psi`` of the concave load law (:mod:`sdplan.latency.knee`); 0 when absent (the straight line).
    load_concavity_sqrt_requests: float = 0.0

    @classmethod
    def from_table(cls, table: Mapping[str, Any]) -> DirectCoefficients:
        """The record of a schema-checked ``[coefficients]`` table."""
        base, spec = table["baseline"], table["speculative"]
        return cls(scaling=table.get("scaling", "proportional"), c1p_s=table["c1p_s"], c2p_s=table["c2p_s"],
                   c1_step_s=base["c1_step_s"], c2_step_s=base["c2_step_s"],
                   c2_step_per_context_token_s=base.get("c2_step_per_context_token_s"),
                   c2_step_fixed_s=float(base.get("c2_step_fixed_s", 0.0)),
                   c1v_s=spec["c1v_s"], c2v_s=spec["c2v_s"], c1d_s=spec["c1d_s"], c2d_s=spec["c2d_s"],
                   c2v_per_context_token_s=spec.get("c2v_per_context_token_s"),
                   c2d_per_context_token_s=spec.get("c2d_per_context_token_s"),
                   frontend_chunk_s=float(table.get("frontend_chunk_s", 0.0)),
                   knee_tokens=float(table.get("knee_tokens", 0.0)),
                   knee_per_token_s=float(table.get("knee_per_token_s", 0.0)),
                   load_concavity_sqrt_requests=float(table.get("load_concavity_sqrt_requests", 0.0)))


@dataclass(frozen=True, slots=True, kw_only=True)
class StepCost:
    """A linear step-time model of one model's forward step (``[step_model.target]``, ``.draft``), seconds.

    ``knee_tokens`` and ``per_token_above_knee_s``: the target's compute-bound knee (:mod:`sdplan.latency.knee`);
    0 where the file gives none.
    """

    fixed_s: float
    per_sequence_s: float
    per_query_token_s: float
    per_context_token_s: float
    knee_tokens: float = 0.0
    per_token_above_knee_s: float = 0.0

    def per_sequence_at(self, query: float, context: float) -> float:
        """What each sequence of ``query`` tokens at KV context ``context`` adds to the step (s):
        ``seq + q tok + s ctx``."""
        return self.per_sequence_s + query * self.per_query_token_s + context * self.per_context_token_s

    def at(self, batch: float, query: float, context: float) -> float:
        """One step over ``batch`` sequences of ``query`` tokens at KV context ``context`` (s), the knee left out:
        ``T(B, q, s) = fixed + B (seq + q tok + s ctx)`` (``docs/model.md#per-step-form``)."""
        return self.fixed_s + batch * self.per_sequence_at(query, context)

    @classmethod
    def from_table(cls, table: Mapping[str, Any]) -> StepCost:
        """The record of a schema-checked step table (no knee where the table gives none)."""
        return cls(fixed_s=table["fixed_s"], per_sequence_s=table["per_sequence_s"],
                   per_query_token_s=table["per_query_token_s"], per_context_token_s=table["per_context_token_s"],
                   knee_tokens=float(table.get("knee_tokens", 0.0)),
                   per_token_above_knee_s=float(table.get("per_token_above_knee_s", 0.0)))


@dataclass(frozen=True, slots=True, kw_only=True)
class PrefillCost:
    """The prefill model (``[step_model.prefill]``), seconds: a prompt of ``p`` tokens costs
    ``fixed + p per_prompt_token + p^2 per_prompt_token_sq`` on its own and adds
    ``p load_per_prompt_token + p^2 load_per_prompt_token_sq`` to the steps it joins. The squared terms are its
    attention over its own prefix (0 in files that do not give them)."""

    fixed_s: float
    per_prompt_token_s: float
    load_per_prompt_token_s: float
    per_prompt_token_sq_s: float = 0.0
    load_per_prompt_token_sq_s: float = 0.0


@dataclass(frozen=True, slots=True, kw_only=True)
class StepModel:
    """The per-step form (``[step_model]``): the target's, the draft's and prefill's step models.

    The speculation overheads are 0 where the file has no ``[step_model.speculation]``, the engine's step
    overhead (every step, SD or not) and its prefill overhead (a request's own, in TTFT) 0 where it has no
    ``[step_model.engine]``.
    """

    target: StepCost
    draft: StepCost
    prefill: PrefillCost
    overhead_fixed_s: float = 0.0
    overhead_per_sequence_s: float = 0.0
    step_overhead_s: float = 0.0
    prefill_overhead_s: float = 0.0

    @classmethod
    def from_table(cls, table: Mapping[str, Any]) -> StepModel:
        """The record of a schema-checked ``[step_model]`` table."""
        prefill = table["prefill"]
        overhead = table.get("speculation", {"overhead_fixed_s": 0.0, "overhead_per_sequence_s": 0.0})
        return cls(target=StepCost.from_table(table["target"]), draft=StepCost.from_table(table["draft"]),
                   prefill=PrefillCost(fixed_s=prefill["fixed_s"], per_prompt_token_s=prefill["per_prompt_token_s"],
                                       load_per_prompt_token_s=prefill["load_per_prompt_token_s"],
                                       per_prompt_token_sq_s=prefill.get("per_prompt_token_sq_s", 0.0),
                                       load_per_prompt_token_sq_s=prefill.get("load_per_prompt_token_sq_s", 0.0)),
                   overhead_fixed_s=overhead["overhead_fixed_s"],
                   overhead_per_sequence_s=overhead["overhead_per_sequence_s"],
                   step_overhead_s=table.get("engine", {}).get("step_overhead_s", 0.0),
                   prefill_overhead_s=table.get("engine", {}).get("prefill_overhead_s", 0.0))


def read_costs(document: Mapping[str, Any]) -> DirectCoefficients | StepModel:
    """The coefficient form of a schema-checked document that holds exactly one."""
    if "coefficients" in document:
        return DirectCoefficients.from_table(document["coefficients"])
    return StepModel.from_table(document["step_model"])


@dataclass(frozen=True, slots=True, kw_only=True)
class Ttft:
    """The TTFT weights (``[ttft]``); the offset and the per-prompt-token prefill are 0 where absent."""

    wait_steps: float
    load_steps: float
    offset_s: float = 0.0
    prefill_per_prompt_token_s: float = 0.0
    closed_loop_load_steps: float | None = None
    source: str | None = None

    @classmethod
    def from_table(cls, table: Mapping[str, Any]) -> Ttft:
        """The record of a schema-checked ``[ttft]`` table."""
        return cls(wait_steps=float(table["wait_steps"]), load_steps=float(table["load_steps"]),
                   offset_s=float(table.get("offset_s", 0.0)),
                   prefill_per_prompt_token_s=float(table.get("prefill_per_prompt_token_s", 0.0)),
                   closed_loop_load_steps=table.get("closed_loop_load_steps"), source=table.get("source"))


@dataclass(frozen=True, slots=True, kw_only=True)
class Uncertainty:
    """The covariance of a fitted calibration's coefficients (``[uncertainty]``).

    Raises
    ------
    InputFileError
        From :meth:`from_table`, when the covariance is not one row and column per parameter.
    """

    parameters: tuple[str, ...]
    covariance_s2: tuple[tuple[float, ...], ...]
    not_identified: tuple[str, ...] = ()
    stderr_above_value: tuple[str, ...] = ()
    method: str | None = None
    #: The spread between repeats of one point, percent (:attr:`sdplan.fitting.validation.RepeatSpread.sd_pct`).
    repeat_sd_pct: float | None = None
    #: The standard deviation of the share of ``c2_step`` that does not grow with the context, percentage points
    #: (:func:`sdplan.fitting.step_share.profile_mean`).
    step_share_sd_pct: float | None = None

    @classmethod
    def from_table(cls, table: Mapping[str, Any], path: str) -> Uncertainty:
        """The record of a schema-checked ``[uncertainty]`` table, checked for a matching covariance."""
        parameters, covariance = tuple(table["parameters"]), table["covariance_s2"]
        if len(covariance) != len(parameters):
            raise InputFileError(path, "uncertainty.covariance_s2",
                                 f"is {len(covariance)}x{len(covariance)} but uncertainty.parameters names "
                                 f"{len(parameters)}; give one row and column per parameter, in that order")
        return cls(parameters=parameters, covariance_s2=tuple(tuple(row) for row in covariance),
                   not_identified=tuple(table.get("not_identified", ())),
                   stderr_above_value=tuple(table.get("stderr_above_value", ())), method=table.get("method"),
                   repeat_sd_pct=table.get("repeat_sd_pct"), step_share_sd_pct=table.get("step_share_sd_pct"))

    @property
    def without_runs(self) -> tuple[str, ...]:
        """The coefficients no run could tell: :attr:`not_identified` less :attr:`stderr_above_value`."""
        weak = set(self.stderr_above_value)
        return tuple(name for name in self.not_identified if name not in weak)


@dataclass(frozen=True, slots=True, kw_only=True)
class Measurement:
    """How a measured calibration was measured (``[measurement]``): the queries' part of it.

    ``server_arguments`` holds the ``vllm serve`` command lines split into words (a line the shell
    could not split is left out), and is None unless the measurement was served and recorded them.
    ``kv_cache`` pairs each configuration whose server reported its KV cache with that cache, tokens.
    The table's other keys describe the run for ``sdplan show`` and stay in the document.
    """

    method: str
    server_commands: tuple[str, ...] = ()
    server_arguments: tuple[tuple[str, ...], ...] | None = None
    points: int | None = None
    kv_cache: tuple[tuple[str, float], ...] = ()
    #: Server starts that measured each configuration (``server_instances_per_configuration``; 1 unrecorded).
    server_instances: int = 1

    @classmethod
    def from_table(cls, table: Mapping[str, Any], path: str) -> Measurement:
        """The record of a schema-checked ``[measurement]`` table.

        Raises
        ------
        InputFileError
            If ``kv_cache_tokens`` and ``kv_cache_configurations`` differ in length.
        """
        commands = tuple(table.get("server_commands", ()))
        arguments = None
        if table["method"] == "served" and commands:
            arguments = []
            for command in commands:
                try:
                    arguments.append(tuple(shlex.split(command)))
                except ValueError:
                    continue
        names, sizes = table.get("kv_cache_configurations"), table.get("kv_cache_tokens")
        kv_cache: tuple[tuple[str, float], ...] = ()
        if names and sizes:
            if len(names) != len(sizes):
                raise InputFileError(path, "measurement.kv_cache_tokens",
                                     f"has length {len(sizes)} but kv_cache_configurations {len(names)}; give one "
                                     "size per configuration, in the same order")
            kv_cache = tuple((str(name), float(size)) for name, size in zip(names, sizes))
        return cls(method=table["method"], server_commands=commands,
                   server_arguments=None if arguments is None else tuple(arguments), points=table.get("points"),
                   kv_cache=kv_cache, server_instances=int(table.get("server_instances_per_configuration", 1)))


@dataclass(frozen=True, slots=True, kw_only=True)
class Derivation:
    """How a derived calibration was priced (``[derivation]``): the queries' part of it.

    The table's other keys (the grids priced, the anchor's figures) stay in the document for
    ``sdplan show``.
    """

    source: str
    package: str
    package_version: str
    licence: str
    system: str
    backend: str
    database_version: str
    measured: str
    max_num_seqs: int
    kv_cache_tokens: int | None
    target_mean_error_pct: float
    target_max_error_pct: float
    kv_cache_tokens_without_draft: int | None = None
    #: The draft lengths whose verification and drafting were priced (``draft_lengths``).
    draft_lengths: tuple[int, ...] = ()
    #: The draft's weights precision and, for a draft model, the GPUs it runs on (None where not written).
    draft_precision: str | None = None
    draft_tensor_parallel_size: int | None = None
    #: The KV cache's dtype where ``sdplan derive --kv-cache-dtype`` chose it (None: auto, the checkpoint's).
    kv_cache_dtype: str | None = None

    @classmethod
    def from_table(cls, table: Mapping[str, Any]) -> Derivation:
        """The record of a schema-checked ``[derivation]`` table."""
        return cls(source=table["source"], package=table["package"], package_version=table["package_version"],
                   licence=table["licence"], system=table["system"], backend=table["backend"],
                   database_version=table["database_version"], measured=table["measured"],
                   max_num_seqs=table["max_num_seqs"], kv_cache_tokens=table.get("kv_cache_tokens"),
                   target_mean_error_pct=table["target_mean_error_pct"],
                   target_max_error_pct=table["target_max_error_pct"],
                   kv_cache_tokens_without_draft=table.get("kv_cache_tokens_without_draft"),
                   draft_lengths=tuple(int(k) for k in table["draft_lengths"]),
                   draft_precision=table.get("draft_precision"),
                   draft_tensor_parallel_size=table.get("draft_tensor_parallel_size"),
                   kv_cache_dtype=table.get("kv_cache_dtype"))


@dataclass(frozen=True, slots=True, kw_only=True)
class CalibrationRecords:
    """Everything a calibration file says, typed; optional tables are None where absent."""

    name: str
    description: str | None
    provenance: Provenance
    reference: ReferenceWorkload
    validity: Validity
    costs: DirectCoefficients | StepModel
    ttft: Ttft | None
    #: A closed loop of N clients loads like ``closed_loop_factor x (N - 1)`` open-loop others (``[closed_loop]``).
    closed_loop_factor: float | None
    acceptance: CalibrationAcceptance | None
    moe: ExpertRouting | None
    uncertainty: Uncertainty | None
    measurement: Measurement | None
    derivation: Derivation | None
    fit_quality: FitQuality | None


def read_records(document: Mapping[str, Any], path: str) -> CalibrationRecords:
    """The typed records of a schema-checked calibration document.

    Raises
    ------
    InputFileError
        Where keys disagree with each other (see each record's ``from_table``), naming ``path`` and the key.
    """

    closed, ttft, acceptance, moe = (document.get(key) for key in ("closed_loop", "ttft", "acceptance", "moe"))
    uncertainty, measurement, derivation, quality = (
        document.get(key) for key in ("uncertainty", "measurement", "derivation", "fit_quality"))
    return CalibrationRecords(
        name=document["name"], description=document.get("description"),
        provenance=Provenance.from_table(document["provenance"], path),
        reference=ReferenceWorkload.from_table(document["reference_workload"]),
        validity=Validity.from_table(document.get("validity")), costs=read_costs(document),
        ttft=None if ttft is None else Ttft.from_table(ttft),
        closed_loop_factor=None if closed is None else float(closed["factor"]),
        acceptance=None if acceptance is None else CalibrationAcceptance.from_table(acceptance),
        moe=None if moe is None else ExpertRouting.from_table(moe),
        uncertainty=None if uncertainty is None else Uncertainty.from_table(uncertainty, path),
        measurement=None if measurement is None else Measurement.from_table(measurement, path),
        derivation=None if derivation is None else Derivation.from_table(derivation),
        fit_quality=None if quality is None else FitQuality.from_table(quality),
    )
