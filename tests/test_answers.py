"""The use cases of ``capacity`` and ``check``: typed queries in, typed answers out, and the views read them.

The CLI parses options into a query, calls one core function and renders its answer; these tests call the core
directly and check that the command's JSON is the answer's (nothing is added on the way), and that the rules
that moved out of ``cli/`` (precedence, refusals, the workload file's defaults) hold in the core.
"""

from __future__ import annotations

import ast
import dataclasses
import json
import re
from pathlib import Path

import numpy as np
import pytest

from sdplan.errors import ExitStatus, InvalidValueError
from sdplan.fileio import dumps_toml
from sdplan.latency import knee
from sdplan.planning.capacity_answer import CapacityQuery, answer_capacity, engine_config_answer, fleet_plan
from sdplan.planning.check_answer import CheckQuery, answer_check
from sdplan.planning.scenario import AcceptanceGiven, ScenarioOptions, resolve_scenario
from sdplan.render.check import capacity_document, check_document

MOE = "h100-sxm_qwen3-30b-a3b_qwen3-0.6b_derived"
TP4 = "4xh100-sxm_qwen3-32b_eagle3_derived"


@pytest.fixture
def chat(tmp_path: Path) -> Path:
    """A workload file: rate 2 req/s, target 50 req/s, 2 GPUs per replica at 2 USD, SD fixed at k=3."""
    path = tmp_path / "chat.toml"
    path.write_text(dumps_toml({
        "schema_version": 1, "name": "chat", "calibration": "h100-sxm_llama-3.1-8b_llama-3.2-1b_derived",
        "slos": ["e2e:mean<=5s"],
        "traffic": {"request_rate_rps": 2.0, "target_rate_rps": 50.0, "prompt_tokens": 1000, "output_tokens": 500},
        "speculation": {"mode": "fixed", "draft_length": 3},
        "deployment": {"gpus_per_replica": 2, "gpu_hour_cost_usd": 2.0},
    }))
    return path


def test_capacity_json_is_the_typed_answer(sdplan) -> None:
    answer = answer_capacity(resolve_scenario(ScenarioOptions(acceptance=AcceptanceGiven(alpha=[0.8]))),
                             CapacityQuery(slos=("e2e:mean<=5s",), target_rate_rps=100.0))
    cap = answer.capacity
    feasible = np.flatnonzero(cap.feasible)
    assert cap.best == feasible[np.argmax(cap.max_rate_rps[feasible])]
    assert answer.fleet is not None and answer.fleet.replicas_saved_by_sd == (
        answer.fleet.no_sd.replicas - answer.fleet.best_sd.replicas) > 0
    result = sdplan("capacity", "--slo", "e2e:mean<=5s", "--target-rate", "100", "--acceptance", "0.8", "-f", "json")
    assert result.exit_code == ExitStatus.OK, result.output
    assert json.loads(result.stdout) == json.loads(json.dumps(capacity_document(answer)))


def test_check_json_is_the_typed_answer(sdplan) -> None:
    answer = answer_check(resolve_scenario(ScenarioOptions()), CheckQuery(rate_rps=12.0, slos=("e2e:mean<=2s",)))
    assert answer.exit_status == ExitStatus.SLO_VIOLATED and not answer.report.passed
    result = sdplan("check", "--rate", "12", "--slo", "e2e:mean<=2s", "-f", "json")
    assert result.exit_code == ExitStatus.SLO_VIOLATED
    assert json.loads(result.stdout) == json.loads(json.dumps(check_document(answer)))


def test_capacity_reports_c2_past_the_knee() -> None:
    scenario = resolve_scenario(ScenarioOptions())
    assert knee.has_knee(scenario.coefficients)
    cap = answer_capacity(scenario, CapacityQuery(slos=("e2e:mean<=5s",))).capacity
    assert cap.knee is not None
    np.testing.assert_array_equal(cap.c2_past_knee_s, cap.knee.c2_above_s)
    assert np.all(cap.c2_past_knee_s >= cap.c2_s) and np.any(cap.c2_past_knee_s > cap.c2_s)
    np.testing.assert_array_equal(dataclasses.replace(cap, knee=None).c2_past_knee_s, cap.c2_s)
    document = capacity_document(answer_capacity(scenario, CapacityQuery(slos=("e2e:mean<=5s",))))
    assert [option["c2_s"] for option in document["options"]] == [float(c2) for c2 in cap.c2_past_knee_s]


def test_gpus_per_replica_come_from_the_flag_then_the_file_then_the_calibration(chat: Path) -> None:
    scenario = resolve_scenario(ScenarioOptions(workload_path=str(chat)))
    table = answer_capacity(scenario, CapacityQuery()).capacity  # the file's SLOs

    def gpus_each(plan) -> float:
        return plan.no_sd.gpus / plan.no_sd.replicas

    assert gpus_each(fleet_plan(scenario, table, 50.0, 3, None)) == 3  # the flag
    from_file = fleet_plan(scenario, table, 50.0, None, None)
    assert gpus_each(from_file) == 2 and from_file.no_sd.cost_per_hour_usd == from_file.no_sd.gpus * 2.0
    assert fleet_plan(scenario, table, 50.0, None, 5.0).no_sd.cost_per_hour_usd == from_file.no_sd.gpus * 5.0
    tp4 = resolve_scenario(ScenarioOptions(calibration=TP4))
    plan = fleet_plan(tp4, answer_capacity(tp4, CapacityQuery(slos=("e2e:mean<=10s",))).capacity, 50.0, None, None)
    assert gpus_each(plan) == 4 and plan.no_sd.cost_per_hour_usd is None  # the calibration's TP size, no price
    answer = answer_capacity(scenario, CapacityQuery())
    assert answer.fleet is not None and answer.fleet.target_rate_rps == 50.0  # the file's target rate
    assert answer_capacity(scenario, CapacityQuery(target_rate_rps=10.0)).fleet.target_rate_rps == 10.0


def test_capacity_of_moe_is_searched_and_writes_its_engine_config() -> None:
    scenario = resolve_scenario(ScenarioOptions(calibration=MOE))
    answer = answer_capacity(scenario, CapacityQuery(slos=("e2e:mean<=5s",)))
    assert answer.capacity.expert_coverage and answer.intervals is None and "MoE" in answer.evaluated_by
    # the simulator prices the experts each step's routed tokens touch too
    from sdplan.planning.simulation_inputs import SimulationSettings

    settings = SimulationSettings(requests=500, seeds=1, seed=0, arrival_cv=1.0)
    simulated = answer_capacity(scenario, CapacityQuery(slos=("e2e:mean<=5s",), use_simulator=True,
                                                        simulation=settings))
    assert simulated.simulated and "simulated" in simulated.evaluated_by
    config = engine_config_answer(scenario, CapacityQuery(), "vllm-config")
    assert config.config is not None and "num_speculative_tokens" in config.config.text
    assert config.schedule.tiers[0][0] == 1 and config.schedule.tiers[-1][1] == config.schedule.max_num_seqs


def test_capacity_without_slos_or_with_an_unknown_engine_is_refused() -> None:
    scenario = resolve_scenario(ScenarioOptions())
    with pytest.raises(InvalidValueError, match="capacity needs SLOs"):
        answer_capacity(scenario, CapacityQuery())
    with pytest.raises(InvalidValueError, match="no engine configuration"):
        engine_config_answer(scenario, CapacityQuery(), "tgi")


def test_check_takes_rate_and_draft_length_from_the_file_unless_given(chat: Path) -> None:
    scenario = resolve_scenario(ScenarioOptions(workload_path=str(chat)))
    from_file = answer_check(scenario, CheckQuery()).report
    assert (from_file.rate_rps, from_file.mode, from_file.draft_length) == (2.0, "fixed", 3)
    assert [verdict.slo.text for verdict in from_file.verdicts] == ["e2e:mean<=5s"]
    given = answer_check(scenario, CheckQuery(rate_rps=1.0, draft_length="off", slos=("ttft:mean<=1s",))).report
    assert (given.rate_rps, given.mode, given.draft_length) == (1.0, "off", 0)
    assert [verdict.slo.text for verdict in given.verdicts] == ["ttft:mean<=1s"]


@pytest.mark.parametrize(("query", "message"), [
    (CheckQuery(slos=("e2e:mean<=5s",)), "no request rate"),
    (CheckQuery(rate_rps=-1.0, slos=("e2e:mean<=5s",)), ">= 0 req/s"),
    (CheckQuery(rate_rps=1.0, slos=("e2e:mean<=5s",), pessimistic=True, use_simulator=True), "do not combine"),
    (CheckQuery(rate_rps=0.0, slos=("e2e:mean<=5s",), use_simulator=True), "rate > 0"),
    (CheckQuery(rate_rps=1.0, slos=("e2e:mean<=5s",), pessimistic=True), "covariance"),
])
def test_check_refuses_what_it_cannot_answer(query: CheckQuery, message: str) -> None:
    with pytest.raises(InvalidValueError, match=re.escape(message)):
        answer_check(resolve_scenario(ScenarioOptions()), query)


def test_root_help_lists_every_exit_status(sdplan) -> None:
    text = " ".join(sdplan("--help").stdout.split())
    listed = text.split("Exit status:", 1)[1].split("See sdplan(1)", 1)[0]
    codes = [int(code) for code in re.findall(r"(\d+) [a-zA-Z]", listed)]
    assert codes == sorted(status.value for status in ExitStatus)


#: The commands that render from a typed answer, and must not edit one on the way.
TYPED_COMMANDS = ("capacity", "check")


def edits(source: str) -> list[int]:
    """Lines of ``source`` that write into a container: ``x[key] = ...``, ``x[key] |= ...``, ``x.update(...)``,
    ``x.setdefault(...)``."""
    found = []
    for node in ast.walk(ast.parse(source)):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(
            node, (ast.AugAssign, ast.AnnAssign)) else []
        if any(isinstance(target, ast.Subscript) for target in targets):
            found.append(node.lineno)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in (
                "update", "setdefault"):
            found.append(node.lineno)
    return sorted(found)


@pytest.mark.parametrize("command", TYPED_COMMANDS)
def test_commands_render_the_answer_without_editing_it(command: str) -> None:
    path = Path(__file__).resolve().parent.parent / "sdplan" / "cli" / f"{command}.py"
    assert edits(path.read_text(encoding="utf-8")) == []


def test_the_edit_check_can_fail() -> None:
    source = ("def f(answer, context):\n    context['warnings'] = []\n    context.update(answer)\n"
              "    context['n'] += 1\n    doc: dict = {}\n    return context\n")
    assert edits(source) == [2, 3, 4]
