"""Load and check the published SD-vs-no-SD measurements in data/sd-measured/.

Each JSON file there holds one public source (see data/sd-measured/README.md
for the schema). This script loads every file, checks it against the schema
(required fields, known point keys with units in their names, positive
numbers, loads that increase), and prints one line per measured series:
setup, mode, number of points, measured speedup range, and whether the
speedup shrinks as the batch or load grows.

    python benchmarks/sd_measured_data.py            # summary, exit 1 on errors
    python benchmarks/sd_measured_data.py --quiet    # errors only

Standard library only. Other code may call `load_all()` to get the checked
records, each series with a list of (load, speedup) pairs attached.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

DATA_DIR = Path(__file__).resolve().parent / "data" / "sd-measured"

MODES = {
    # mode -> the point keys that may carry the load
    "closed_loop_batch": ("batch", "concurrency"),
    "open_loop_rate": ("rate_rps",),
}
LOAD_KEYS = {"batch", "concurrency", "rate_rps"}
# SD/baseline value pairs; for latencies a smaller value is better.
PAIRS = (
    ("sd_tokens_per_s", "baseline_tokens_per_s", "throughput"),
    ("sd_tokens_per_s_per_user", "baseline_tokens_per_s_per_user", "throughput"),
    ("sd_latency_s", "baseline_latency_s", "latency"),
    ("sd_tpot_s", "baseline_tpot_s", "latency"),
)
VALUE_KEYS = {k for pair in PAIRS for k in pair[:2]} | {"speedup", "speedup_stated"}
# A point may carry the acceptance measured at it: tokens per cycle, the bonus token included.
ACCEPTANCE_KEY = "acceptance_tokens_per_cycle"
# Or vLLM's draft acceptance rate there: accepted over drafted tokens, 0-1 (a cycle then emits 1 + k x rate tokens).
DRAFT_RATE_KEY = "draft_acceptance_rate"
POINT_KEYS = LOAD_KEYS | VALUE_KEYS | {ACCEPTANCE_KEY, DRAFT_RATE_KEY}
DRAFT_METHODS = {"eagle", "eagle3", "draft_model", "mtp", "ngram", "medusa", "other"}
#: The target's weights precision a series may state (``sdplan derive --precision``).
PRECISIONS = ("bf16", "fp8", "fp8_block", "nvfp4", "mxfp4")
KV_CACHE_DTYPES = ("auto", "bf16", "fp8")
READING_METHODS = {"table", "text", "plot_labels", "vector_plot", "raster_plot", "raw_data"}
#: What a source must give; its ``url`` and ``repo_refs`` (where public data was read) only where it has them.
SOURCE_FIELDS = ("title", "authors", "reference", "locator")
SERIES_FIELDS = ("id", "locator", "hardware", "engine", "target_model", "draft",
                 "acceptance", "workload", "mode", "metric", "reading", "points")
# A stated speedup may differ from the ratio of the stated values by rounding.
STATED_SPEEDUP_TOLERANCE = 0.02
# Speedup changes smaller than this count as flat when judging the trend.
TREND_TOLERANCE = 0.01


def _positive_number(value) -> bool:
    return (isinstance(value, (int, float)) and not isinstance(value, bool)
            and math.isfinite(value) and value > 0)


def point_speedup(point: dict) -> float | None:
    """SD speedup of one point: > 1 means SD is faster than no SD."""
    for sd_key, base_key, kind in PAIRS:
        if sd_key in point and base_key in point:
            sd, base = point[sd_key], point[base_key]
            return sd / base if kind == "throughput" else base / sd
    if "speedup" in point:
        return point["speedup"]
    return point.get("speedup_stated")


def point_load(point: dict) -> tuple[str, float] | None:
    for key in ("batch", "concurrency", "rate_rps"):
        if key in point:
            return key, point[key]
    return None


def point_tokens_per_cycle(point: dict, k: int) -> float | None:
    """The acceptance measured at a point as tokens per cycle, bonus included: ``acceptance_tokens_per_cycle``, or
    ``1 + k r`` from vLLM's draft acceptance rate ``r`` (accepted over drafted tokens, ``k`` drafted a cycle:
    ``vllm:spec_decode_num_accepted_tokens / vllm:spec_decode_num_draft_tokens``); None where it gives neither."""
    if ACCEPTANCE_KEY in point:
        return float(point[ACCEPTANCE_KEY])
    if DRAFT_RATE_KEY in point:
        return 1.0 + k * float(point[DRAFT_RATE_KEY])
    return None


#: ``acceptance.metric`` wordings read as tokens per cycle with the bonus token: vLLM's and SGLang's mean
#: acceptance length ("accept len" in SGLang's log) and the EAGLE papers' average acceptance length count it.
TOKENS_PER_CYCLE_WORDS = ("tokens per cycle", "acceptance length", "accept length", "accept len")


def series_tokens_per_cycle(series: dict) -> float | None:
    """The series' own acceptance as tokens per cycle (bonus included), where ``acceptance.metric`` says what it is;
    None otherwise. Read: one number in tokens per cycle (:data:`TOKENS_PER_CYCLE_WORDS`); vLLM's draft
    acceptance rate ``r`` (accepted over drafted tokens) as ``1 + k r``; vLLM's per-position acceptance rates
    (each position's accepted drafts over the cycles, ``spec_decode_num_accepted_tokens_per_pos``) as
    ``1 + sum(r_i)``, at most ``k`` of them."""
    acc = series.get("acceptance")
    if not isinstance(acc, dict):
        return None
    metric, value = str(acc.get("metric") or "").lower(), acc.get("value")
    draft = series.get("draft")
    k = draft.get("k_tokens") if isinstance(draft, dict) else None
    if any(words in metric for words in TOKENS_PER_CYCLE_WORDS):
        return float(value) if _positive_number(value) else None
    if not (isinstance(k, int) and k >= 1):
        return None
    if "draft acceptance rate" in metric and _fraction(value):
        return 1.0 + k * float(value)
    if "per-position acceptance rate" in metric and isinstance(value, list) and 0 < len(value) <= k and all(
            _fraction(rate) for rate in value):
        return 1.0 + sum(float(rate) for rate in value)
    return None


def _fraction(value: object) -> bool:
    """A number in [0, 1] (an acceptance rate)."""
    return (isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
            and 0.0 <= value <= 1.0)


def _per_cycle_error(what: str, tokens: float | None, draft: object) -> list[str]:
    """The error of an acceptance in tokens per cycle that no chain of the series' ``k_tokens`` can emit (a cycle
    emits its bonus token and at most its k drafts: 1 to k + 1); none where it is within, not a positive number
    (said elsewhere), or the draft gives no k to hold it to."""
    k = draft.get("k_tokens") if isinstance(draft, dict) else None
    if not _positive_number(tokens) or not isinstance(k, int) or 1.0 <= tokens <= k + 1:
        return []
    return [f"{what} is tokens per cycle with the bonus token: between 1 and k_tokens + 1 = {k + 1}, got {tokens!r}"]


def check_series(series: dict, where: str) -> list[str]:
    errors = []
    for field in SERIES_FIELDS:
        if field not in series:
            errors.append(f"{where}: missing field '{field}'")
    if errors:
        return errors
    hw = series["hardware"]
    if not isinstance(hw, dict) or not hw.get("gpu"):
        errors.append(f"{where}: hardware.gpu missing")
    else:
        for key in ("count", "tensor_parallel"):
            if not (isinstance(hw.get(key), int) and hw[key] >= 1):
                errors.append(f"{where}: hardware.{key} must be a positive integer")
    if not isinstance(series["engine"], dict) or not series["engine"].get("name") \
            or "version" not in series["engine"]:
        errors.append(f"{where}: engine needs name and version (version may say 'not stated')")
    elif "max_running_requests" in series["engine"] and not (
            isinstance(series["engine"]["max_running_requests"], int)
            and not isinstance(series["engine"]["max_running_requests"], bool)
            and series["engine"]["max_running_requests"] >= 1):
        errors.append(f"{where}: engine.max_running_requests must be a positive integer (vLLM --max-num-seqs, "
                      f"SGLang --max-running-requests), got {series['engine']['max_running_requests']!r}")
    draft = series["draft"]
    if not isinstance(draft, dict) or draft.get("method") not in DRAFT_METHODS:
        errors.append(f"{where}: draft.method must be one of {sorted(DRAFT_METHODS)}")
    else:
        if not (isinstance(draft.get("k_tokens"), int) and draft["k_tokens"] >= 1):
            errors.append(f"{where}: draft.k_tokens must be a positive integer")
        if draft.get("structure") not in ("chain", "tree"):
            errors.append(f"{where}: draft.structure must be 'chain' or 'tree'")
    acc = series["acceptance"]
    if not isinstance(acc, dict) or "metric" not in acc or "value" not in acc:
        errors.append(f"{where}: acceptance needs 'metric' and 'value' (both may be null)")
    elif acc["value"] is not None and not acc["metric"]:
        errors.append(f"{where}: acceptance.value given without saying which metric")
    elif series_tokens_per_cycle(series) is not None:
        tokens = series_tokens_per_cycle(series)
        what = "acceptance.value" if tokens == acc["value"] else f"acceptance.value {acc['value']!r}, read as {tokens}"
        errors.extend(_per_cycle_error(f"{where}: {what}", tokens, draft))
    if not isinstance(series["workload"], dict) or not series["workload"].get("dataset"):
        errors.append(f"{where}: workload.dataset missing")
    else:
        for key in ("prompt_tokens_mean", "output_tokens_mean", "max_output_tokens"):
            if key in series["workload"] and not _positive_number(series["workload"][key]):
                errors.append(f"{where}: workload.{key} must be a positive number, got {series['workload'][key]!r}")
        copies = series["workload"].get("batch_of_copies")
        if copies is not None and not isinstance(copies, bool):
            errors.append(f"{where}: workload.batch_of_copies must be true or false, got {copies!r}")
        elif copies and not (series.get("mode") == "closed_loop_batch" and isinstance(series.get("points"), list)
                             and all(isinstance(point, dict) and "batch" in point for point in series["points"])):
            errors.append(f"{where}: workload.batch_of_copies says each batch is one prompt copied; give it only "
                          "with closed_loop_batch points keyed by batch")
    if not (isinstance(series["target_model"], str) and series["target_model"]):
        errors.append(f"{where}: target_model must be the model's name (a non-empty string)")
    if isinstance(draft, dict) and draft.get("model") is not None and not (isinstance(draft["model"], str)
                                                                           and draft["model"]):
        errors.append(f"{where}: draft.model must be the draft's name or null")
    # optional fields that say how sd_measured.py prices a series no setup of its own covers
    if "precision" in series and series["precision"] not in PRECISIONS:
        errors.append(f"{where}: precision must be one of {list(PRECISIONS)} (the target's weights)")
    if "kv_cache_dtype" in series and series["kv_cache_dtype"] not in KV_CACHE_DTYPES:
        errors.append(f"{where}: kv_cache_dtype must be one of {list(KV_CACHE_DTYPES)} (vLLM's --kv-cache-dtype)")
    if "panel" in series and not (isinstance(series["panel"], str) and series["panel"]):
        errors.append(f"{where}: panel must be a non-empty string (the series measured side by side share one)")
    if "sdplan" in series and not (isinstance(series["sdplan"], dict)
                                   and isinstance(series["sdplan"].get("calibration"), str)
                                   and series["sdplan"]["calibration"]):
        errors.append(f"{where}: sdplan must be an object with 'calibration' (a shipped name or a file)")
    mode = series["mode"]
    if mode not in MODES:
        errors.append(f"{where}: mode must be one of {sorted(MODES)}")
        return errors
    reading = series["reading"]
    if not isinstance(reading, dict) or reading.get("method") not in READING_METHODS:
        errors.append(f"{where}: reading.method must be one of {sorted(READING_METHODS)}")
    elif reading["method"] in ("vector_plot", "raster_plot", "plot_labels") and not any(
            k.startswith("error_abs") and _positive_number(v) for k, v in reading.items()):
        errors.append(f"{where}: a plot reading needs a positive error_abs_<unit> estimate")
    points = series["points"]
    if not isinstance(points, list) or not points:
        errors.append(f"{where}: points must be a non-empty list")
        return errors
    loads = []
    for i, point in enumerate(points):
        pw = f"{where} point {i}"
        if not isinstance(point, dict):
            errors.append(f"{pw}: not an object")
            continue
        for key, value in point.items():
            if key not in POINT_KEYS:
                errors.append(f"{pw}: unknown key '{key}' (keys carry units: "
                              f"{sorted(POINT_KEYS)})")
            elif not _positive_number(value):
                errors.append(f"{pw}: '{key}' must be a positive number, got {value!r}")
        errors.extend(_per_cycle_error(f"{pw}: '{ACCEPTANCE_KEY}'", point.get(ACCEPTANCE_KEY), draft))
        if DRAFT_RATE_KEY in point and ACCEPTANCE_KEY in point:
            errors.append(f"{pw}: give '{ACCEPTANCE_KEY}' or '{DRAFT_RATE_KEY}', not both")
        elif _positive_number(point.get(DRAFT_RATE_KEY)) and point[DRAFT_RATE_KEY] > 1:
            errors.append(f"{pw}: '{DRAFT_RATE_KEY}' is accepted over drafted tokens, at most 1; got "
                          f"{point[DRAFT_RATE_KEY]!r} (a percentage? write it as a fraction)")
        load = point_load(point)
        if load is None or load[0] not in MODES[mode]:
            errors.append(f"{pw}: needs one of {MODES[mode]} for mode {mode}")
        else:
            if load[0] in ("batch", "concurrency") and not float(load[1]).is_integer():
                errors.append(f"{pw}: {load[0]} must be a whole number")
            loads.append(load)
        for sd_key, base_key, _ in PAIRS:
            if (sd_key in point) != (base_key in point):
                errors.append(f"{pw}: '{sd_key}' and '{base_key}' come in pairs")
        speedup = point_speedup(point)
        if speedup is None:
            errors.append(f"{pw}: no SD/baseline pair and no speedup")
        elif "speedup_stated" in point and abs(speedup - point["speedup_stated"]) \
                > STATED_SPEEDUP_TOLERANCE * point["speedup_stated"]:
            errors.append(f"{pw}: stated speedup {point['speedup_stated']} disagrees with "
                          f"the stated values ({speedup:.3f})")
    if len({k for k, _ in loads}) > 1:
        errors.append(f"{where}: points mix load keys")
    values = [v for _, v in loads]
    if any(b <= a for a, b in zip(values, values[1:])):
        errors.append(f"{where}: loads must strictly increase")
    return errors


def check_file(path: Path) -> tuple[dict | None, list[str]]:
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        return None, [f"{path.name}: cannot load: {exc}"]
    errors = []
    if doc.get("schema_version") != 1:
        errors.append(f"{path.name}: schema_version must be 1")
    if doc.get("id") != path.stem:
        errors.append(f"{path.name}: id must equal the file name stem '{path.stem}'")
    if doc.get("measured") is not True:
        errors.append(f"{path.name}: 'measured' must be true (only measured data belongs here)")
    source = doc.get("source")
    if not isinstance(source, dict):
        errors.append(f"{path.name}: missing source")
    else:
        for field in SOURCE_FIELDS:
            if not source.get(field):
                errors.append(f"{path.name}: source.{field} missing")
        if source.get("url") is not None and not isinstance(source["url"], str):
            errors.append(f"{path.name}: source.url must be a string (the page the data was read from)")
        refs = source.get("repo_refs", [])
        if not (isinstance(refs, list) and all(isinstance(ref, str) and ref for ref in refs)):
            errors.append(f"{path.name}: source.repo_refs must be a list of 'owner/repo@commit:path' strings")
    series_list = doc.get("series")
    if not isinstance(series_list, list) or not series_list:
        errors.append(f"{path.name}: series must be a non-empty list")
        return doc, errors
    ids = [s.get("id") for s in series_list if isinstance(s, dict)]
    if len(ids) != len(set(ids)):
        errors.append(f"{path.name}: series ids repeat")
    for s in series_list:
        if not isinstance(s, dict):
            errors.append(f"{path.name}: a series is not an object")
            continue
        errors += check_series(s, f"{path.name}:{s.get('id', '?')}")
    fitted = doc.get("fitted_step_model")
    if fitted is not None and fitted.get("measured") is not False:
        errors.append(f"{path.name}: fitted_step_model must say measured: false")
    return doc, errors


def trend(speedups: list[float]) -> str:
    """'shrinks', 'flat', 'grows' or 'mixed' as the load increases."""
    if len(speedups) < 2:
        return "n/a"
    steps = [b - a for a, b in zip(speedups, speedups[1:])]
    if all(abs(d) <= TREND_TOLERANCE for d in steps):
        return "flat"
    if all(d <= TREND_TOLERANCE for d in steps):
        return "shrinks"
    if all(d >= -TREND_TOLERANCE for d in steps):
        return "grows"
    return "mixed (last < first)" if speedups[-1] < speedups[0] else "mixed"


def load_all(data_dir: Path = DATA_DIR) -> tuple[list[dict], list[str]]:
    docs, errors = [], []
    files = sorted(data_dir.glob("*.json"))
    if not files:
        errors.append(f"no JSON files in {data_dir}")
    for path in files:
        doc, errs = check_file(path)
        errors += errs
        if doc is None or errs:
            continue
        for s in doc["series"]:
            s["speedup_curve"] = [(point_load(p)[1], point_speedup(p)) for p in s["points"]]
        docs.append(doc)
    return docs, errors


def summary_line(doc: dict, s: dict) -> str:
    hw = s["hardware"]
    draft = s["draft"]
    loads = [x for x, _ in s["speedup_curve"]]
    sps = [y for _, y in s["speedup_curve"]]
    load_key = point_load(s["points"][0])[0]
    draft_name = draft["model"] or draft["method"]
    return (f"{doc['id']}/{s['id']}: {hw['count']}x{hw['gpu']} TP{hw['tensor_parallel']} | "
            f"{s['engine']['name']} | {s['target_model']} + {draft['method']} "
            f"({draft_name}, k={draft['k_tokens']}) | {s['mode']} {load_key} "
            f"{loads[0]:g}-{loads[-1]:g} | {len(sps)} pts | speedup "
            f"{min(sps):.2f}-{max(sps):.2f} ({sps[0]:.2f} -> {sps[-1]:.2f}) | "
            f"with load: {trend(sps)} | read: {s['reading']['method']}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", type=Path, default=DATA_DIR)
    parser.add_argument("--quiet", action="store_true", help="print errors only")
    args = parser.parse_args(argv)
    docs, errors = load_all(args.data_dir)
    if not args.quiet:
        for doc in docs:
            for s in doc["series"]:
                print(summary_line(doc, s))
        n_series = sum(len(d["series"]) for d in docs)
        n_points = sum(len(s["points"]) for d in docs for s in d["series"])
        print(f"{len(docs)} sources, {n_series} series, {n_points} points; "
              f"{len(errors)} schema errors")
    for err in errors:
        print(f"ERROR {err}", file=sys.stderr)
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
