"""Coefficients at a workload: both coefficient forms scaled to other prompt and output lengths.

A calibration gives its costs in one of two forms (``sdplan-calibration(5)``):
the direct form, Kong et al.'s coefficients at the reference workload, scaled
by proportional rules (:func:`direct_coefficients_at`); or the per-step form,
linear step-time models from which the coefficients follow at any length
(:func:`coefficients_from_steps`, ``docs/model.md#per-step-form``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sdplan.calibration.records import DirectCoefficients, ReferenceWorkload, StepModel
from sdplan.latency.coefficients import Coefficients


def mean_context(prompt_tokens: float, output_tokens: float) -> float:
    """Time-averaged KV context per sequence during decoding, ``p + g/2`` tokens."""
    return prompt_tokens + output_tokens / 2.0


def costs_at(costs: DirectCoefficients | StepModel, reference: ReferenceWorkload, prompt_tokens: float,
             output_tokens: float) -> Coefficients:
    """The cost coefficients of either form at a workload of ``prompt_tokens`` in and ``output_tokens`` out."""
    if isinstance(costs, DirectCoefficients):
        return direct_coefficients_at(costs, reference, prompt_tokens, output_tokens)
    return coefficients_from_steps(costs, prompt_tokens, output_tokens)


def scale_direct(document: Mapping[str, Any], prompt_tokens: float, output_tokens: float) -> Coefficients:
    """Direct-form coefficients of a document's ``[coefficients]`` scaled from its ``[reference_workload]``.

    For tables built in memory (a fit's coefficient vector); a loaded calibration holds the records
    and calls :func:`direct_coefficients_at` itself.
    """
    return direct_coefficients_at(DirectCoefficients.from_table(document["coefficients"]),
                                  ReferenceWorkload.from_table(document["reference_workload"]),
                                  prompt_tokens, output_tokens)


def direct_coefficients_at(direct: DirectCoefficients, reference: ReferenceWorkload, prompt_tokens: float,
                           output_tokens: float) -> Coefficients:
    """Direct-form coefficients scaled from the reference workload.

    Notes
    -----
    With ``scaling = "proportional"`` (the default), following the reported
    scalings (``docs/model.md#length-scaling``) and the step model
    (:func:`coefficients_from_steps`), with ``s = p + g/2`` the mean context:

    * prefill: ``c1p``, ``c2p`` scale with ``p/p_ref``;
    * per-concurrent-request step costs are affine in the context,
      ``c(s) = c_ref + (s - s_ref) * slope``, with the slopes
      ``c2v_per_context_token_s``, ``c2d_per_context_token_s`` and
      ``c2_step_per_context_token_s`` when the file gives them (then the
      direct form equals the step model it was taken from at every workload).
      Without slopes, ``c2v`` and ``c2_step`` (KV reads of one sequence) are
      taken proportional to ``s`` (no intercept, V5), and ``c2d`` constant:
      it is the marginal cost of one drafted token, its verification
      compute plus a small draft step (``T.tok + D.seq + D.tok + s D.ctx``),
      mostly independent of the context. Scaling ``c2d`` with ``s``
      overstated saturation 2.1x at p = g = 128;
    * ``c1v``, ``c1d``, ``c1_step`` (the batch-1 step costs) hold one
      sequence's own context cost (step model: ``c1v = T.fixed + overhead +
      c2v``), so with a slope they move by ``(s - s_ref) * slope`` as their
      ``c2`` does; without one they stay fixed (the batch-1 context share is
      unknown, and fixed costs dominate them).

    The output length enters the model itself through ``g/E``.

    ``c2_step_fixed_s`` (optional, 0 by default): the part of ``c2_step``
    that does not grow with the context, each running sequence's own share of
    a step's work (its matmul rows, sampling); only the rest, ``c2_step -
    c2_step_fixed``, scales as above. Fitted from runs at several contexts
    (:func:`sdplan.fitting.fit.fit_pooled`): on GPUs the per-sequence step cost is
    affine in the context (AIConfigurator's measured Qwen3-32B rows on H100
    TP4, tests/data/aic-silicon: 0.125 ms per client at 1024/1024 and 0.29 ms
    at 4096/1024, a ratio of 2.3 for a context ratio of 3).
    """
    proportional = direct.scaling == "proportional"
    reference_context = mean_context(reference.prompt_tokens, reference.output_tokens)
    shift = mean_context(prompt_tokens, output_tokens) - reference_context if proportional else 0.0
    prefill = prompt_tokens / reference.prompt_tokens if proportional else 1.0

    def affine(value: float, slope: float | None, default_slope: float) -> float:
        return max(value + shift * (default_slope if slope is None else slope), 0.0)

    def own(value: float, slope: float | None) -> float:
        """A batch-1 cost: it holds its own sequence's context cost, moved only by a given slope."""
        return max(value + shift * (slope or 0.0), 0.0)

    v_slope, d_slope = direct.c2v_per_context_token_s, direct.c2d_per_context_token_s
    step_slope = direct.c2_step_per_context_token_s
    step_fixed = min(direct.c2_step_fixed_s, direct.c2_step_s)
    step_context = direct.c2_step_s - step_fixed
    return Coefficients(
        c1p_s=direct.c1p_s * prefill,
        c2p_s=direct.c2p_s * prefill,
        c1v_s=own(direct.c1v_s, v_slope),
        c2v_s=affine(direct.c2v_s, v_slope, direct.c2v_s / reference_context),
        c1d_s=own(direct.c1d_s, d_slope),
        c2d_s=affine(direct.c2d_s, d_slope, 0.0),
        baseline_c1_step_s=own(direct.c1_step_s, step_slope),
        baseline_c2_step_s=step_fixed + affine(step_context, step_slope, step_context / reference_context),
        prompt_tokens=float(prompt_tokens),
        output_tokens=float(output_tokens),
        frontend_chunk_s=direct.frontend_chunk_s,  # per chunk, whatever the lengths
        knee_tokens=direct.knee_tokens,  # token rows of a step, whatever the lengths
        knee_per_token_s=direct.knee_per_token_s,
        load_concavity_sqrt_requests=direct.load_concavity_sqrt_requests,  # requests in flight, whatever the lengths
    )


def coefficients_from_steps(steps: StepModel, prompt_tokens: float, output_tokens: float) -> Coefficients:
    """Kong coefficients from per-step linear time models.

    Notes
    -----
    A forward step over ``B`` sequences of ``q`` query tokens each at mean
    context ``s`` costs ``T(B, q, s) = fixed + B*(per_sequence + q*per_query_token
    + s*per_context_token)``. An SD cycle is one target step with ``q = k+1``
    and ``k`` draft steps with ``q = 1``; a plain decode step is one target
    step with ``q = 1``. ``C1`` is the batch-size-1 (synchronous) latency, so
    it carries the request's own per-sequence cost, and ``B C2`` with
    ``B = lambda L`` counts the others (``docs/model.md#per-step-form``). With
    ``s = p + g/2``, per cycle ``tau(B) = (c1v + k c1d) + (B - 1)(c2v + k c2d)``::

        c2v = T.seq + T.tok + s T.ctx + overhead_seq
        c2d = T.tok + D.seq + D.tok + s D.ctx     (the k extra verified tokens)
        c1v = T.fixed + o_step + overhead_fixed + c2v      c1d = D.fixed + c2d
        c1p = P.fixed + o_prefill + p P.tok + p^2 P.tok2       c2p = p P.load_tok + p^2 P.load_tok2
        baseline: c2_step = T.seq + T.tok + s T.ctx,  c1_step = T.fixed + o_step + c2_step

    with ``o_step`` the engine's host overhead per step (``[step_model.engine]``), SD or not, and
    ``o_prefill`` its time around a request's own prefill: in that request's TTFT and latency, not in the
    interference ``c2p`` other requests pay. The squared terms (``P.tok2``, ``P.load_tok2``) are a prompt's
    attention over its own prefix, whose FLOPs grow as ``p^2`` (``docs/model.md#per-step-form``); 0 where a
    file gives none.

    The draft's KV context is taken equal to the target's. The target's
    compute-bound knee, where the file gives one, is carried as it is
    (:mod:`sdplan.latency.knee`): it does not depend on the workload.
    """
    target, draft, prefill = steps.target, steps.draft, steps.prefill
    context = mean_context(prompt_tokens, output_tokens)
    target_per_sequence = target.per_sequence_at(1.0, context)
    c2v = target_per_sequence + steps.overhead_per_sequence_s
    c2d = (target.per_query_token_s + draft.per_sequence_s + draft.per_query_token_s
           + context * draft.per_context_token_s)
    square = prompt_tokens**2
    c1p_sq, c2p_sq = square * prefill.per_prompt_token_sq_s, square * prefill.load_per_prompt_token_sq_s
    return Coefficients(
        c1p_s=prefill.fixed_s + steps.prefill_overhead_s + prompt_tokens * prefill.per_prompt_token_s + c1p_sq,
        c2p_s=prompt_tokens * prefill.load_per_prompt_token_s + c2p_sq,
        c1p_sq_s=c1p_sq,
        c2p_sq_s=c2p_sq,
        server_prefill_s=steps.prefill_overhead_s,
        c1v_s=target.fixed_s + steps.step_overhead_s + steps.overhead_fixed_s + c2v,
        c2v_s=c2v,
        c1d_s=draft.fixed_s + c2d,
        c2d_s=c2d,
        baseline_c1_step_s=target.fixed_s + steps.step_overhead_s + target_per_sequence,
        baseline_c2_step_s=target_per_sequence,
        prompt_tokens=float(prompt_tokens),
        output_tokens=float(output_tokens),
        knee_tokens=target.knee_tokens,
        knee_per_token_s=target.per_token_above_knee_s,
    )
