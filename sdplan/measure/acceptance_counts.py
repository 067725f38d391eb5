"""vLLM's speculative-decoding counters over a run, and the ``[acceptance]`` table they give.

The in-process engine (:mod:`sdplan._vllm`) reads them for ``sdplan calibrate
--method engine --acceptance-prompts``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sdplan.inputs.acceptance import alpha_from_mean_length


@dataclass(frozen=True, slots=True)
class AcceptanceCounts:
    """vLLM's speculative-decoding counters over a run (differences of before/after snapshots)."""

    num_drafts: int
    num_draft_tokens: int
    num_accepted_tokens: int
    accepted_per_position: tuple[int, ...]

    @property
    def draft_length(self) -> int:
        return len(self.accepted_per_position)

    @property
    def draft_acceptance_rate(self) -> float:
        """Fraction of drafted tokens accepted (vLLM's acceptance rate, as a fraction)."""
        return self.num_accepted_tokens / self.num_draft_tokens if self.num_draft_tokens else 0.0

    @property
    def mean_acceptance_length(self) -> float:
        """Tokens per cycle, bonus included: ``1 + accepted/drafts``."""
        return 1.0 + self.num_accepted_tokens / self.num_drafts if self.num_drafts else 1.0

    @property
    def per_position_rates(self) -> tuple[float, ...]:
        """Conditional per-position rates ``a_i`` = accepted at i / accepted at i-1 (drafts for i = 1)."""
        rates = []
        previous = self.num_drafts
        for accepted in self.accepted_per_position:
            rates.append(accepted / previous if previous else 0.0)
            previous = accepted
        return tuple(rates)

    @property
    def per_token_alpha(self) -> float:
        """The i.i.d. alpha with the same mean acceptance length at this draft length."""
        k = self.draft_length
        tau = min(max(self.mean_acceptance_length, 1.0), k + 1.0)
        return float(alpha_from_mean_length(tau, k))

    def document(self, source: str) -> dict[str, Any]:
        """The ``[acceptance]`` table of a calibration."""
        return {
            "per_token_alpha": round(self.per_token_alpha, 6),
            "measured_at_k": self.draft_length,
            "per_position_rates": [round(rate, 6) for rate in self.per_position_rates],
            "source": f"{source}; {self.num_drafts} drafts, {self.num_draft_tokens} draft tokens, "
            f"{self.num_accepted_tokens} accepted (draft acceptance rate {self.draft_acceptance_rate:.4f}, "
            f"mean acceptance length {self.mean_acceptance_length:.4f})",
        }
