"""A closed loop of ``N`` clients: mean latency, TTFT and throughput of one option.

A closed loop (``vllm bench serve --max-concurrency N``, GuideLLM's concurrent profile, a static batch of
``N`` streams) keeps ``N`` requests in flight: each client sends its next request when the last one
finishes. The model prices it as the planner prices an open loop, with the others in flight fixed at
``f (N - 1)`` instead of ``lambda L`` (``docs/model.md#open-and-closed-loops``)::

    L(N) = C1 + f (N - 1) C2,        X(N) = N / L(N) requests a second,

past the target's compute-bound knee with the demands that hold there (:mod:`sdplan.latency.knee`), and for a
mixture-of-experts target at the expert coverage of ``N`` sequences' routed tokens (:mod:`sdplan.latency.moe`).
An engine holds at most ``N_cap`` requests (``max_num_seqs``, or what its KV cache holds): past it the other
``N - N_cap`` clients wait for admission, the server completes ``N_cap / L(N_cap)`` a second, and by Little's law
a client's request takes ``N L(N_cap) / N_cap`` (``docs/model.md#saturation-and-batch-cap``).

One home for both users of the rule: ``sdplan validate`` predicting a measured closed loop
(:func:`sdplan.fitting.validation.predict_latency`) and ``sdplan plan --concurrency`` planning one.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import numpy as np

from sdplan.latency import knee, model
from sdplan.latency import moe as moe_model

if TYPE_CHECKING:
    from sdplan.latency.coefficients import Coefficients
    from sdplan.latency.moe import MoESpec


@dataclass(frozen=True, slots=True)
class ClosedLoopPoint:
    """One option's steady state in a closed loop of ``clients``.

    Attributes
    ----------
    clients : int
        ``N``: requests the clients keep in flight.
    running : int
        Requests the engine runs at once: ``N``, or its cap where the clients are more.
    latency_s : float
        Mean end-to-end latency, a client's send to its last token, waiting for admission included.
    ttft_s : float
        Mean time to first token, the wait for admission included.
    """

    clients: int
    running: int
    latency_s: float
    ttft_s: float

    @property
    def throughput_rps(self) -> float:
        """Completed requests a second: ``N / L`` (Little's law)."""
        return self.clients / self.latency_s

    @property
    def waiting(self) -> int:
        """Clients whose request waits for admission: ``N - N_cap`` past the cap, else 0."""
        return self.clients - self.running

    def with_clients(self, clients: int) -> ClosedLoopPoint:
        """The same engine, as full, under ``clients`` >= :attr:`clients` of a point nobody waits in: the others
        wait for admission (:func:`waited_latency`, :func:`admission_wait_s`)."""
        if self.waiting or clients < self.running:
            raise ValueError("with_clients extends a point where every client runs to more clients")
        latency = waited_latency(self.latency_s, self.running, clients)
        return ClosedLoopPoint(clients=clients, running=self.running, latency_s=latency,
                               ttft_s=self.ttft_s + admission_wait_s(latency, self.running, clients))

    def with_opening_wave(self, coefficients: Coefficients, chunk_tokens: float, requests: int) -> ClosedLoopPoint:
        """The means a run of ``requests`` in all measures: the opening wave added to the steady state.

        The clients send their first requests at once, so those prompts queue for prefill; over the run's
        ``R = requests / N`` rounds that adds ``(m(N') - 1) c2p / R`` to mean TTFT, for the ``N'`` requests the
        engine holds, and nothing to mean latency: the wave moves the run's prefills to its start, it does not
        add any (:func:`sdplan.latency.model.closed_loop_waves_s`, the wave that opens the run only;
        ``docs/model.md#ttft-and-tpot``). ``chunk_tokens`` is the engine's prefill budget a step. An option
        that serves nothing stays so. ``requests`` is at least the clients: a run sends every client's first
        request (:func:`sdplan.planning.closed_loop_answer.check_requests` refuses fewer).
        """
        if not math.isfinite(self.latency_s):
            return self
        ttft, latency = model.closed_loop_waves_s(coefficients, self.running, chunk_tokens,
                                                  requests / self.clients, recurs=False)
        return replace(self, latency_s=self.latency_s + latency, ttft_s=self.ttft_s + ttft)


def admitted_clients(clients: int, batch_cap: float | None) -> int:
    """Requests an engine of ``batch_cap`` runs at once of a closed loop of ``clients``: ``min(N, floor(cap))``.

    A cap below one request (a KV cache that holds none) is not a cap here: the callers refuse such a
    workload before (:meth:`sdplan.inputs.serving.EngineLimits.require_fit`).
    """
    if batch_cap is None or not clients > batch_cap >= 1:
        return clients
    return int(math.floor(batch_cap))


def covered_coefficients(coefficients: Coefficients, draft_length: int, others: float,
                         moe: MoESpec | None) -> Coefficients:
    """The coefficients at the expert coverage of a step with ``others`` in flight (dense: as given).

    ``phi(t (1 + B))`` per step, ``t`` the tokens a sequence routes: 1 without SD, ``k + 1`` with
    (:func:`sdplan.latency.moe.routed_tokens`); the prefill at ``phi(p)`` (:func:`sdplan.latency.moe.at_coverage`).
    """
    if moe is None:
        return coefficients
    return moe_model.at_coverage(coefficients, moe, float(moe.phi(moe_model.routed_tokens(
        routed_per_sequence(draft_length), others))))


def routed_per_sequence(draft_length: int) -> float:
    """Tokens each sequence routes through the target per step: 1 without SD, ``k + 1`` with."""
    return 1.0 if draft_length == 0 else draft_length + 1.0


def option_demand(coefficients: Coefficients, draft_length: int, tokens_per_cycle: float
                  ) -> tuple[float, float, knee.KneeDemands]:
    """``(C1, C2, demands past the knee)`` of one option: its column of
    :func:`sdplan.latency.model.option_demands` (``g - 1`` decode steps without SD, ``g/E`` cycles with)."""
    demands = model.option_demands(coefficients, [max(draft_length, 1)], np.asarray([tokens_per_cycle]))
    column = 1 if draft_length else 0
    return float(demands.c1_s[column]), float(demands.c2_s[column]), knee.take(demands.knee, column)


def closed_loop_latency(coefficients: Coefficients, draft_length: int, tokens_per_cycle: float, clients: int,
                        moe: MoESpec | None = None, batch_cap: float | None = None) -> float:
    """Mean latency (s) of a closed loop of ``clients``: ``C1 + f (N - 1) C2``, ``x N / N_cap`` past the cap.

    Parameters
    ----------
    coefficients : Coefficients
        Cost coefficients at the workload, with the option's draft coverage.
    draft_length : int
        ``k`` (0: no SD).
    tokens_per_cycle : float
        ``E`` of the option (1 without SD).
    clients : int
        ``N`` >= 1.
    moe : MoESpec, optional
        A mixture-of-experts target's routing and coverage increments; None for a dense target.
    batch_cap : float, optional
        Requests the engine holds at once (None: no cap).

    Returns
    -------
    float
        ``L = C1' + f (N' - 1) C2'`` at ``N' = min(N, N_cap)`` running (the demands past the knee where
        ``f (N' - 1)`` is beyond it, at the coverage of ``N'`` sequences), times ``N / N'``.
    """
    running = admitted_clients(clients, batch_cap)
    c1, c2, past = option_demand(covered_coefficients(coefficients, draft_length,
                                                      model.closed_loop_others(running), moe),
                                 draft_length, tokens_per_cycle)
    others = model.closed_loop_others(running, coefficients.closed_loop_factor)
    c1_at, c2_at = knee.batch_cap_demands(c1, c2, past, others)
    return waited_latency(float(c1_at + others * c2_at), running, clients)


def waited_latency(served_s: float, running: int, clients: int) -> float:
    """A client's mean latency when the engine runs ``running`` of ``clients`` requests, each served in
    ``served_s``: the server completes ``running / served_s`` a second, so by Little's law ``N L(N') / N'``."""
    return served_s * clients / running


def admission_wait_s(latency_s: float, running: int, clients: int) -> float:
    """The mean wait for admission within a client's ``latency_s``: the latency less its own service,
    ``L (1 - N' / N)``."""
    return latency_s * (1.0 - running / clients)


def closed_loop_ttft(coefficients: Coefficients, draft_length: int, tokens_per_cycle: float, clients: int,
                     latency_s: float, moe: MoESpec | None = None, batch_cap: float | None = None) -> float:
    """Mean TTFT (s) of a closed loop of ``clients`` whose mean latency is ``latency_s``.

    :func:`sdplan.latency.model.time_to_first_token` with ``f (N' - 1)`` others at the coverage of ``N'``
    running sequences; past the cap plus the wait for admission, the latency less the admitted request's own
    ``L(N_cap)``: ``L (1 - N_cap / N)``.
    """
    if not math.isfinite(latency_s):
        return math.inf
    running = admitted_clients(clients, batch_cap)
    others = model.closed_loop_others(running, coefficients.closed_loop_factor)
    covered = covered_coefficients(coefficients, draft_length, model.closed_loop_others(running), moe)
    own = float(model.time_to_first_token(covered, draft_length, others, tokens_per_cycle))
    return own + admission_wait_s(latency_s, running, clients)


def closed_loop_point(coefficients: Coefficients, draft_length: int, tokens_per_cycle: float, clients: int,
                      moe: MoESpec | None = None, batch_cap: float | None = None) -> ClosedLoopPoint:
    """One option's :class:`ClosedLoopPoint` in a closed loop of ``clients`` (:func:`closed_loop_latency`,
    :func:`closed_loop_ttft`)."""
    latency = closed_loop_latency(coefficients, draft_length, tokens_per_cycle, clients, moe, batch_cap)
    return ClosedLoopPoint(clients=clients, running=admitted_clients(clients, batch_cap), latency_s=latency,
                           ttft_s=closed_loop_ttft(coefficients, draft_length, tokens_per_cycle, clients, latency,
                                                   moe, batch_cap))
