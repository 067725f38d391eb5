"""What the simulator takes and returns: the configuration (checked on its own) and one replication's result."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from sdplan.errors import InvalidValueError
from sdplan.inputs.serving import KvHold
from sdplan.limits import MAX_SIMULATED_RATE_RPS, MIN_SIMULATED_RATE_RPS

if TYPE_CHECKING:
    import numpy.typing as npt

    from sdplan.latency.moe import MoESpec

    FloatArray = npt.NDArray[np.float64]

#: Fraction of the earliest requests discarded as warm-up (the empty system is not steady state).
WARMUP_FRACTION = 0.1
PERCENTILES = (50, 90, 99)


@dataclass(frozen=True, slots=True, kw_only=True)
class SimulationConfig:
    """What to simulate. Times in seconds, lengths in tokens."""

    rate_rps: float
    draft_length: int  # 0: SD off
    position_rates: tuple[float, ...]  # P(A >= j), j = 1..k (alpha**j for i.i.d.)
    requests: int = 20_000
    prompt_tokens: int | FloatArray = 1024
    output_tokens: int | FloatArray = 512
    arrival_cv: float = 1.0  # 1: Poisson; > 1 bursty (gamma inter-arrivals)
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    kv_cache_tokens: float = math.inf
    #: What an admitted request holds of the KV cache, its mean over its life (vLLM fills the cache as requests
    #: run); the default reserves its prompt, output and lookahead slots at admission.
    kv_hold: KvHold = KvHold()
    #: Goodput-adaptive policy: candidate draft lengths (0 = off allowed) chosen per step by E(k)/tau_k(B)
    #: (SmartSpec); ``draft_length`` and ``position_rates`` then only give the rates for the longest k.
    adaptive_draft_lengths: tuple[int, ...] | None = None
    #: Fraction of the earliest requests left out of the statistics (0 to compare with a served benchmark,
    #: which starts from an empty engine and keeps every request).
    warmup_fraction: float = WARMUP_FRACTION
    #: An MoE target's routing and coverage increments (:class:`sdplan.latency.moe.MoESpec`): each step then pays
    #: for the experts its routed tokens touch, as the planner's steps do; None for a dense target.
    moe: MoESpec | None = None

    def validate(self) -> None:
        """Refuse an impossible configuration, or a request larger than the KV budget (it could never be admitted).

        Raises
        ------
        InvalidValueError
            Naming the field and the fix.
        """
        n = int(self.requests)
        if n < 10:
            raise InvalidValueError("simulate at least 10 requests")
        if self.rate_rps <= 0:
            raise InvalidValueError("the request rate must be > 0 req/s")
        if not MIN_SIMULATED_RATE_RPS <= self.rate_rps <= MAX_SIMULATED_RATE_RPS:
            raise InvalidValueError(f"a simulated request rate must be {MIN_SIMULATED_RATE_RPS:g} to "
                                    f"{MAX_SIMULATED_RATE_RPS:g} req/s, got {self.rate_rps:g}; give a rate a replica "
                                    "could see")
        k = self.draft_length
        if k and self.adaptive_draft_lengths is None and len(self.position_rates) != k:
            raise InvalidValueError(f"acceptance must cover the draft length {k}")
        if self.adaptive_draft_lengths is not None and any(
                o > len(self.position_rates) for o in self.adaptive_draft_lengths):
            raise InvalidValueError("acceptance must cover every candidate draft length")
        prompt, output = self.lengths()
        if np.any(output < 1) or np.any(prompt < 1):
            raise InvalidValueError("prompt and output lengths must be >= 1 token")
        largest = float(np.max(prompt + output)) + self.draft_length  # with SD, k lookahead slots too
        if largest > self.kv_cache_tokens:
            raise InvalidValueError(f"a request of {largest:g} tokens (prompt + output + k) does not fit the KV budget "
                                    f"of {self.kv_cache_tokens:g} tokens and could never be admitted; raise "
                                    "--kv-cache-tokens or shorten the requests")
        if not 0.0 <= self.warmup_fraction < 1.0:
            raise InvalidValueError("the warm-up fraction must lie in [0, 1)")
        if self.max_num_batched_tokens < self.max_num_seqs:
            raise InvalidValueError(f"the token budget per step ({self.max_num_batched_tokens}, "
                                    f"max_num_batched_tokens) must be at least the batch cap ({self.max_num_seqs}, "
                                    "max_num_seqs), as vLLM requires; raise --max-num-batched-tokens or lower "
                                    "--max-num-seqs")

    def lengths(self) -> tuple[FloatArray, FloatArray]:
        """Prompt and output tokens of every request, shape ``(requests,)``."""
        n = int(self.requests)
        prompt = np.broadcast_to(np.asarray(self.prompt_tokens, dtype=np.float64), (n,)).copy()
        output = np.broadcast_to(np.asarray(self.output_tokens, dtype=np.float64), (n,)).copy()
        return prompt, output


@dataclass(frozen=True, slots=True)
class SimulationResult:
    """Per-request samples after warm-up, and time averages."""

    e2e_s: FloatArray
    ttft_s: FloatArray
    tpot_s: FloatArray
    queue_s: FloatArray
    duration_s: float
    mean_running: float
    mean_in_system: float
    throughput_tok_s: float
    arrival_rate_rps: float
    tokens_per_cycle: float
    mean_draft_length: float = math.nan  # time-averaged k under the adaptive policy
    #: False when the queue kept growing (past saturation): the statistics are not steady-state values.
    steady: bool = True

    def statistic(self, metric: str, statistic: str) -> float:
        values = {"e2e": self.e2e_s, "ttft": self.ttft_s, "tpot": self.tpot_s, "queue": self.queue_s}[metric]
        values = values[np.isfinite(values)]
        if values.size == 0:
            return math.nan
        if statistic == "mean":
            return float(values.mean())
        return float(np.percentile(values, float(statistic.lstrip("p"))))


#: A run is not at steady state when N(t) rises over the run by more than this many residual spreads ...
STEADY_RISE_SPREADS = 3.0
#: ... and by more than this fraction of its mean.
STEADY_RISE_FRACTION = 0.25


def is_steady(arrival: FloatArray, finish: FloatArray) -> bool:
    """Whether the number of requests in the system stopped growing during the arrivals.

    ``N(t) = #arrivals <= t - #finishes <= t`` is sampled at 80 times over
    [20%, 100%] of the arrival span and a line is fitted. An overloaded
    replica's ``N`` grows about linearly, so its rise over the window is large
    against the scatter around the line; a stable one wanders around its mean
    (slowly near saturation, with a spread of 20-25% of the mean), so the
    fitted rise is comparable to the scatter. Flags a rise above 3 residual
    standard deviations and above 25% of the mean. On the default calibration
    (k=3, 6 seeds x 1,500/4,000/8,000 requests): none flagged at rho 0.8, all
    at rho 1.05 and above; near rho = 1 (0.92 with the batch cap of 256
    binding) about half, and there the statistics are indeed still transient.
    """
    end = float(arrival[-1])
    times = np.linspace(0.2 * end, end, 80)
    in_system = (np.searchsorted(arrival, times, side="right")
                 - np.searchsorted(np.sort(finish), times, side="right")).astype(np.float64)
    slope, intercept = np.polyfit(times, in_system, 1)
    spread = float(np.std(in_system - (slope * times + intercept)))
    rise = float(slope) * 0.8 * end
    return not (rise > STEADY_RISE_SPREADS * spread and rise > STEADY_RISE_FRACTION * float(in_system.mean()))
