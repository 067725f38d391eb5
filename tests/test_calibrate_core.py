"""The calibrator on synthetic engines: the fit recovers known coefficients; runs resume."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from sdplan.errors import InputFileError
from sdplan.measure.acceptance_counts import AcceptanceCounts
from sdplan.measure.engine import GRIDS, Grid, MeasurementStore, measure, plan_tasks
from sdplan.measure.stepfit import fit_calibration, step_model_document

TRUE_TARGET = {"fixed_s": 0.012, "per_sequence_s": 2e-4, "per_query_token_s": 8e-4, "per_context_token_s": 3e-6}
TRUE_DRAFT = {"fixed_s": 0.004, "per_sequence_s": 1e-4, "per_context_token_s": 1e-6}
TRUE_OVERHEAD = 0.002
TRUE_PREFILL = {"fixed_s": 0.003, "per_prompt_token_s": 4e-4}
GRID = Grid(batch_sizes=(1, 2, 4, 8), draft_lengths=(1, 2, 4), prompt_tokens=(64, 256), prefill_tokens=(32, 128, 512),
            decode_steps=10)


class SyntheticRunner:
    """Step times from known coefficients, with multiplicative noise.

    ``switch_on_s`` is paid by every step with SD on (verification and SD steps), not by plain decode.
    """

    def __init__(self, noise: float = 0.01, seed: int = 7, fail_after: int | None = None,
                 switch_on_s: float = 0.0) -> None:
        self.random = random.Random(seed)
        self.noise = noise
        self.calls = 0
        self.fail_after = fail_after
        self.switch_on_s = switch_on_s

    def _tick(self) -> None:
        self.calls += 1
        if self.fail_after is not None and self.calls > self.fail_after:
            raise KeyboardInterrupt

    def _jitter(self, value: float) -> float:
        return value * (1.0 + self.random.gauss(0.0, self.noise))

    def _target(self, batch: int, query: int, context: float) -> float:
        t = TRUE_TARGET
        step = t["fixed_s"] + batch * (t["per_sequence_s"] + query * t["per_query_token_s"]
                                       + context * t["per_context_token_s"])
        return step + (self.switch_on_s if query > 1 else 0.0)

    def target_steps(self, batch, draft_length, prompt_tokens, steps):
        self._tick()
        return [self._jitter(self._target(batch, draft_length + 1, prompt_tokens + i)) for i in range(steps)]

    def speculative_steps(self, batch, draft_length, prompt_tokens, steps):
        self._tick()
        d = TRUE_DRAFT
        out = []
        for i in range(steps):
            s = prompt_tokens + i
            draft = draft_length * (d["fixed_s"] + batch * (d["per_sequence_s"] + s * d["per_context_token_s"]))
            out.append(self._jitter(self._target(batch, draft_length + 1, s) + draft + TRUE_OVERHEAD))
        return out

    def prefill_seconds(self, prompt_tokens):
        self._tick()
        return self._jitter(TRUE_PREFILL["fixed_s"] + prompt_tokens * TRUE_PREFILL["per_prompt_token_s"])


def run(tmp_path: Path, runner: SyntheticRunner, resume: bool = False):
    store = MeasurementStore(tmp_path / "m.jsonl", {"grid": "test"})
    done = store.start(resume)
    return measure(plan_tasks(GRID), runner, GRID, store, done), store


def test_fit_recovers_known_coefficients(tmp_path: Path) -> None:
    measurements, _ = run(tmp_path, SyntheticRunner(noise=0.01))
    fit = fit_calibration(measurements)
    for key, value in TRUE_TARGET.items():
        assert fit.target.as_dict()[key] == pytest.approx(value, rel=0.1), key
    draft = fit.speculative.as_dict()
    assert draft["draft_fixed_s"] == pytest.approx(TRUE_DRAFT["fixed_s"], rel=0.15)
    assert draft["draft_per_context_token_s"] == pytest.approx(TRUE_DRAFT["per_context_token_s"], rel=0.3)
    assert draft["overhead_fixed_s"] == pytest.approx(TRUE_OVERHEAD, abs=1.5e-3)
    assert fit.prefill.as_dict()["per_prompt_token_s"] == pytest.approx(TRUE_PREFILL["per_prompt_token_s"], rel=0.05)
    assert fit.r2 > 0.98
    assert all(value >= 0 for table in step_model_document(fit).values() for value in table.values())


def test_noiseless_fit_is_exact(tmp_path: Path) -> None:
    measurements, _ = run(tmp_path, SyntheticRunner(noise=0.0))
    fit = fit_calibration(measurements)
    for key, value in TRUE_TARGET.items():
        assert fit.target.as_dict()[key] == pytest.approx(value, rel=1e-6)
    assert fit.r2 == pytest.approx(1.0, abs=1e-9)


def test_the_cost_of_switching_sd_on_is_its_own_term(tmp_path: Path) -> None:
    # Every step with SD on (verification and full SD steps) pays 0.4 ms that plain decode does not.
    measurements, _ = run(tmp_path, SyntheticRunner(noise=0.0, switch_on_s=4e-4))
    fit = fit_calibration(measurements)
    target = fit.target.as_dict()
    for key, value in TRUE_TARGET.items():  # the plain-decode step is not charged for it
        assert target[key] == pytest.approx(value, rel=1e-6), key
    assert target["switch_on_fixed_s"] == pytest.approx(4e-4, rel=1e-6)
    assert target["switch_on_per_sequence_s"] == pytest.approx(0.0, abs=1e-9)
    speculation = step_model_document(fit)["speculation"]
    assert speculation["overhead_fixed_s"] == pytest.approx(TRUE_OVERHEAD + 4e-4, rel=1e-5)  # SD options pay both
    assert fit.r2 == pytest.approx(1.0, abs=1e-9)


def test_switch_on_cost_is_not_identified_without_plain_decode_steps(tmp_path: Path) -> None:
    measurements, _ = run(tmp_path, SyntheticRunner(noise=0.0))
    verification_only = [m for m in measurements if not (m.kind == "target" and m.draft_length == 0)]
    fit = fit_calibration(verification_only)
    assert "switch_on_fixed_s" not in fit.target.as_dict()
    assert any("switching SD on is not identified" in note for note in fit.notes)


def test_interrupted_run_keeps_measurements_and_resumes(tmp_path: Path) -> None:
    with pytest.raises(KeyboardInterrupt):
        run(tmp_path, SyntheticRunner(fail_after=5))
    store = MeasurementStore(tmp_path / "m.jsonl", {"grid": "test"})
    kept = store.load()
    assert len(kept) == 2  # each prefill task costs 2 engine calls (one warm-up): the 6th call was interrupted
    resumed_runner = SyntheticRunner()
    measurements, _ = run(tmp_path, resumed_runner, resume=True)
    assert len(measurements) == len(plan_tasks(GRID))
    remaining = [t for t in plan_tasks(GRID) if t.key not in {m.key for m in kept}]
    assert resumed_runner.calls == sum(2 if t.kind == "prefill" else 1 for t in remaining)  # nothing measured twice
    assert {m.key for m in measurements} == {t.key for t in plan_tasks(GRID)}


def test_csv_store_round_trips(tmp_path: Path) -> None:
    store = MeasurementStore(tmp_path / "m.csv", {"grid": "csv"})
    done = store.start(resume=False)
    results = measure(plan_tasks(GRID)[:4], SyntheticRunner(), GRID, store, done)
    assert store.load() == results


def test_resume_refuses_another_configuration(tmp_path: Path) -> None:
    store = MeasurementStore(tmp_path / "m.jsonl", {"grid": "test"})
    store.start(resume=False)
    other = MeasurementStore(tmp_path / "m.jsonl", {"grid": "other"})
    with pytest.raises(InputFileError, match="another configuration"):
        other.load()
    (tmp_path / "junk.jsonl").write_text("not json\n")
    with pytest.raises(InputFileError, match="not a measurement store"):
        MeasurementStore(tmp_path / "junk.jsonl", {}).load()


@pytest.mark.parametrize(("name", "content"), [
    ("list.jsonl", b"[1, 2]\n"),  # a first line that is JSON but not an object
    ("rows.jsonl", b'{"config": {}}\n[1]\n'),  # a measurement that is not an object
    ("latin1.jsonl", b'{"config": "\xe9"}\n'),  # not UTF-8
    ("field.csv", b'# {"config": {}}\nkey,value\n"' + b"x" * 200_000 + b'",1\n'),  # a CSV field over 128 KiB
])
def test_damaged_stores_are_input_errors(tmp_path: Path, name: str, content: bytes) -> None:
    (tmp_path / name).write_bytes(content)
    with pytest.raises(InputFileError, match="not a measurement store|cannot read"):
        MeasurementStore(tmp_path / name, {}).load()


def test_grids_are_ordered_by_size() -> None:
    sizes = [len(plan_tasks(GRIDS[name])) for name in ("quick", "standard", "thorough")]
    assert sizes == sorted(sizes) and sizes[0] >= 10


def test_acceptance_counts() -> None:
    # docs/engines.md#successor-test-models, draft "m3", k=3: 21 drafts, 63 draft tokens, 42 accepted,
    # per position [21, 21, 0]
    counts = AcceptanceCounts(num_drafts=21, num_draft_tokens=63, num_accepted_tokens=42,
                              accepted_per_position=(21, 21, 0))
    assert counts.draft_acceptance_rate == pytest.approx(2 / 3)
    assert counts.mean_acceptance_length == pytest.approx(3.0)
    assert counts.per_position_rates == (1.0, 1.0, 0.0)
    alpha = counts.per_token_alpha
    assert 1 + alpha + alpha**2 + alpha**3 == pytest.approx(3.0, rel=1e-9)
    doc = counts.document("successor fixture")
    assert doc["measured_at_k"] == 3 and "42 accepted" in doc["source"]


def test_reference_acceptance_simulator_matches_published_counts() -> None:
    """The reference used by the real-engine tests reproduces the counts vLLM measured (k=3, 64 tokens).

    The counts are in docs/engines.md#successor-test-models.
    """
    from sdplan.testing.tiny_models import simulate_acceptance

    prompt = list(range(10, 42))
    published = {None: (16, 48, 48), 2: (32, 96, 32), 3: (21, 63, 42), 5: (25, 75, 38)}
    for skip, counts in published.items():
        assert simulate_acceptance(prompt, 64, 3, skip)[:3] == counts, skip


def test_a_fitted_cost_never_lands_outside_its_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    """BVLS can return a rounding error past a bound (-5.1e-21 s, seen on a CPU engine calibration, which the
    file's schema then refused with exit 3); every bounded fit goes through one solver that clips it."""
    import numpy as np
    import scipy.optimize

    from sdplan.fitting import regression

    class Rounded:
        x = np.array([-5.1e-21, 0.5, 2.0 + 1e-16])

    monkeypatch.setattr(scipy.optimize, "lsq_linear", lambda *args, **kwargs: Rounded())
    solved = regression.bounded_solve(np.eye(3), np.ones(3), 0.0, np.array([1.0, 1.0, 2.0]))
    assert solved.tolist() == [0.0, 0.5, 2.0]
    assert regression.nonnegative_solve(np.eye(3), np.ones(3)).min() >= 0.0
