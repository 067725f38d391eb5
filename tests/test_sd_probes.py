"""The prompt-heavy probe on SD configurations, on a real served calibration that measured every probe.

Data (tests/data/served-sd-probes-cpu/README.md): a quick-grid calibration whose SD configurations also
measured the decode-heavy probe, which the quick grid leaves out: those points, on the same servers minutes
apart, say how well SD at another workload is predicted without the drift between servers.
"""

from __future__ import annotations

from pathlib import Path

from sdplan.fitting.fit import fit_pooled
from sdplan.fitting.validation import predict_latency
from sdplan.measure.levels import SERVED_GRIDS
from sdplan.runs import read_results

DATA = Path(__file__).parent / "data" / "served-sd-probes-cpu"


def sd_probe(run, kind: str) -> bool:
    return run.draft_length > 0 and f"_{kind}-c" in run.source


def held_out_errors_pct(train: list, held_out: list) -> list[float]:
    fit = fit_pooled(train)
    return [(predict_latency(fit.coefficients_at(r.prompt_tokens, r.output_tokens), r) / r.mean_e2e_latency_s
             - 1.0) * 100.0 for r in held_out]


def test_the_quick_grid_measures_the_prompt_probe_on_sd_configurations() -> None:
    assert SERVED_GRIDS["quick"].speculative_probes == ("prompt",)
    assert SERVED_GRIDS["standard"].speculative_probes == SERVED_GRIDS["thorough"].speculative_probes == (
        "prompt", "decode")


def test_sd_at_another_prompt_length_predicts_sd_at_another_output_length() -> None:
    runs = read_results(DATA, "vllm")[0]
    decode = [r for r in runs if sd_probe(r, "decode")]
    assert len(runs) == 36 and len(decode) == 4  # k = 2 and 4 at N = 1 and 64, 32/192 tokens
    before = held_out_errors_pct([r for r in runs if not sd_probe(r, "prompt") and r not in decode], decode)
    now = held_out_errors_pct([r for r in runs if r not in decode], decode)
    mean_abs = [sum(abs(e) for e in errors) / len(errors) for errors in (now, before)]
    # measured: 5.4% with the SD prompt probes (N = 64: -2.5% at k=2, -1.7% at k=4), 15.9% without
    # (+23.9%, +24.5%): the SD steps do not follow the context as the no-SD ones do
    assert mean_abs[0] < 8.0 and mean_abs[0] < mean_abs[1] - 5.0, (now, before)
    at_the_top = [e for r, e in zip(decode, now) if r.concurrency == 64]
    assert all(abs(e) < 8.0 for e in at_the_top), now


def test_without_the_sd_prompt_probe_sd_at_four_times_the_prompt_is_under_predicted() -> None:
    """What the quick grid measured before: SD only at the calibration's own workload."""
    runs = read_results(DATA, "vllm")[0]
    prompt = [r for r in runs if sd_probe(r, "prompt")]
    errors = held_out_errors_pct([r for r in runs if not sd_probe(r, "prompt") and not sd_probe(r, "decode")], prompt)
    # measured -7.7% to -26.0% (mean -15.4%; -14.5% to -26.2% with all of c2_step growing with the context)
    assert len(prompt) == 4 and all(e < 0.0 for e in errors) and sum(errors) / len(errors) < -10.0, errors
