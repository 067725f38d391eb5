"""The cost coefficients the latency model runs on (:mod:`sdplan.latency.model`).

One record per (hardware, target, draft) pair at one workload: what a
calibration file's coefficients become once scaled to the workload
(:mod:`sdplan.calibration`), and what every prediction of :mod:`sdplan.latency.model`,
the planner and the simulator takes. The demand decomposition they enter is
derived in ``docs/model.md#demand-decomposition``.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

#: TTFT weights (in steps) where no TTFT was fitted: half a running step of wait, and a mixed step and a half
#: with the others in flight (``docs/model.md#ttft-and-tpot``).
DEFAULT_TTFT_WAIT_STEPS = 0.5
DEFAULT_TTFT_LOAD_STEPS = 1.5
#: Coefficients that only SD runs determine (the verify and draft costs): a fit without SD runs leaves them
#: unidentified, and SD cannot be planned from it.
SPECULATIVE_PARAMETERS = ("c1v_s", "c2v_s", "c1d_s", "c2d_s")

@dataclass(frozen=True, slots=True, kw_only=True)
class Coefficients:
    """Cost coefficients of one (hardware, target, draft) pair at one workload.

    All values are seconds; "per concurrent request" means the cost is paid
    once for every other request in flight (the ``C2`` side).

    Attributes
    ----------
    c1p_s, c2p_s : float
        Prefill: load-independent seconds per request; seconds per request per
        concurrent request (interference of other requests' prefills).
    c1p_sq_s, c2p_sq_s : float
        The parts of ``c1p_s`` and ``c2p_s`` that grow as the square of the prompt, a prompt's attention over
        its own prefix: ``P.tok2 E[p^2]`` and ``P.load_tok2 E[p^2]`` (``[step_model.prefill]
        per_prompt_token_sq_s``, ``load_per_prompt_token_sq_s``; ``docs/model.md#per-step-form``). 0 by
        default: a prefill linear in the prompt.
    prompt_cv : float
        Coefficient of variation of the prompt lengths the prefill terms are averaged over
        (:func:`over_prompts`): ``E[p^2] = p^2 (1 + cv^2)`` with ``p = prompt_tokens``. 0 by default: every
        prompt is ``prompt_tokens`` long.
    server_prefill_s : float
        The part of ``c1p_s`` that is the server's time around the request's prefill, not the engine's
        (``[step_model.engine] prefill_overhead_s``): in that request's TTFT and latency, but no step
        waits for it. 0 by default.
    c1v_s, c2v_s : float
        One verification step of the target over ``k+1`` tokens: seconds per
        cycle; seconds per cycle per concurrent request.
    c1d_s, c2d_s : float
        One drafted token (draft step plus the marginal verification of that
        token): seconds per draft token; seconds per draft token per
        concurrent request.
    baseline_c1_step_s, baseline_c2_step_s : float
        One plain (no SD) decode step of one token: seconds per step; seconds
        per step per concurrent request.
    prompt_tokens, output_tokens : float
        The workload the coefficients hold for (``p`` and ``g``).
    ttft_wait_steps, ttft_load_steps : float
        Time to first token under load, in units of the running option's
        step costs (:func:`sdplan.latency.model.time_to_first_token`): the fixed part of the step
        an arrival waits for, and the per-other-request part. Defaults 0.5 and
        1.5 (wait for half a step, then one mixed step;
        ``docs/model.md#ttft-and-tpot``).
    ttft_offset_s : float
        What TTFT adds to ``c1p`` at zero load beyond the wait (s; fitted from
        measured TTFT: the serving stack's own first-token cost, or minus what
        ``c1p`` overstates), 0 by default.
    ttft_prefill_s : float
        What TTFT adds for the request's own prefill beyond ``c1p`` (s, at this
        workload's prompt: ``[ttft] prefill_per_prompt_token_s`` times the prompt
        length), 0 by default. Fitted where TTFT was measured at several prompt
        lengths: ``c1p`` is a small share of the end-to-end latency, which the
        E2E fit may leave near 0, while TTFT at low load is mostly the prefill.
    frontend_chunk_s : float
        Serving-frontend seconds per streamed chunk (one chunk per step that emits tokens): ``C2`` is at
        least the answer's chunks times this (:func:`sdplan.latency.model.frontend_floor`). 0 (no floor) unless a
        calibration measured it.
    knee_tokens, knee_per_token_s : float
        The compute-bound knee of the target's step (:mod:`sdplan.latency.knee`): a decode or verification
        step of ``T`` token rows costs ``knee_per_token_s * max(0, T - knee_tokens)`` (s) beyond its
        linear step model. ``knee_per_token_s = 0`` (the default) is no knee.
    draft_coverage : float
        Share of a sequence's SD cycles in which the proposer drafts (``c``, in (0, 1]). A prompt-lookup
        proposer (vLLM ``ngram``) drafts nothing for a sequence whose context has no match, and that
        sequence verifies one token row, not ``k + 1``: a cycle drafts ``c k`` tokens and puts ``1 + c k``
        rows per sequence into the target's step (:func:`sdplan.latency.model.drafted_tokens`). 1 (the default)
        for a proposer that runs a model. Set from the workload's measured draft coverage
        (:attr:`sdplan.inputs.acceptance.AcceptanceSpec.coverage`), which also scales the tokens per cycle.
    load_concavity_sqrt_requests : float
        ``psi`` (square root of requests) of the concave load law ``L = C1 + C2 (B + psi sqrt(B))``
        (:mod:`sdplan.latency.knee`, ``docs/model.md#concave-load``): the first requests in flight cost more
        each than later ones, and saturation stays at ``1/C2``. 0 (the default) is Kong et al.'s straight line.
    closed_loop_factor : float
        Only for predicting closed-loop benchmarks (``N`` clients):
        ``L = C1 + f (N - 1) C2`` (see :mod:`sdplan.fitting.fit`). The planner's open-loop
        predictions do not use it.
    """

    c1p_s: float
    c2p_s: float
    c1p_sq_s: float = 0.0
    c2p_sq_s: float = 0.0
    prompt_cv: float = 0.0
    server_prefill_s: float = 0.0
    c1v_s: float
    c2v_s: float
    c1d_s: float
    c2d_s: float
    baseline_c1_step_s: float
    baseline_c2_step_s: float
    prompt_tokens: float
    output_tokens: float
    ttft_wait_steps: float = DEFAULT_TTFT_WAIT_STEPS
    ttft_load_steps: float = DEFAULT_TTFT_LOAD_STEPS
    ttft_offset_s: float = 0.0
    ttft_prefill_s: float = 0.0
    frontend_chunk_s: float = 0.0
    closed_loop_factor: float = 1.0
    knee_tokens: float = 0.0
    knee_per_token_s: float = 0.0
    draft_coverage: float = 1.0
    load_concavity_sqrt_requests: float = 0.0


def over_prompts(coefficients: Coefficients, prompt_cv: float) -> Coefficients:
    """The prefill terms averaged over prompts of mean ``p`` and coefficient of variation ``cv``.

    Parameters
    ----------
    coefficients : Coefficients
        Coefficients at the mean prompt ``p = prompt_tokens`` (at any ``prompt_cv`` already applied).
    prompt_cv : float
        ``sd(p) / mean(p)`` of the prompts (>= 0).

    Returns
    -------
    Coefficients
        ``c1p`` and ``c2p`` with their squared parts at ``E[p^2] = p^2 (1 + cv^2)`` instead of ``p^2``::

            E[c1p(p)] = c1p(p) + P.tok2 Var(p)        E[c2p(p)] = c2p(p) + P.load_tok2 Var(p)

    Notes
    -----
    The model works at the mean request, and the linear terms' mean is the mean prompt's. The squared terms'
    is not: the mean of ``p^2`` exceeds the square of the mean by the variance, so a mix of short and long
    prompts costs more prefill than its mean prompt (``docs/model.md#per-step-form``).
    """
    scale = (1.0 + prompt_cv**2) / (1.0 + coefficients.prompt_cv**2)
    c1p_sq, c2p_sq = coefficients.c1p_sq_s * scale, coefficients.c2p_sq_s * scale
    return replace(coefficients, c1p_s=coefficients.c1p_s - coefficients.c1p_sq_s + c1p_sq,
                   c2p_s=coefficients.c2p_s - coefficients.c2p_sq_s + c2p_sq, c1p_sq_s=c1p_sq, c2p_sq_s=c2p_sq,
                   prompt_cv=prompt_cv)
