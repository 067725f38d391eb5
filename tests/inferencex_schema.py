"""InferenceX's published row shapes, re-stated from its source so the fixtures can be checked against them.

Both functions follow the code cited in ``tests/data/inferencex/README.md`` line by line:

- :func:`runner_row`: ``utils/process_result.py`` of SemiAnalysisAI/InferenceX (commit 843c6254), single-node
  path: the deployment comes from the runner's environment, the measurements from ``vllm bench serve``'s
  result JSON (every key ending in ``ms`` renamed without ``_ms`` and divided by 1000; every key holding
  ``tpot`` also gives ``intvty`` = 1000 / value). Nothing else of the result is kept: vLLM's
  ``spec_decode_*`` counters are dropped, and no field names the draft length.
- :func:`api_row`: ``mapBenchmarkRow`` (``packages/db/src/etl/benchmark-mapper.ts``) and the
  ``BenchmarkRow`` the API returns (``packages/db/src/queries/benchmarks.ts``) of
  SemiAnalysisAI/InferenceX-app (commit 77ca49a6): a v1 (single ``tp``/``ep``) runner row's deployment
  fields, ``spec_method`` = ``spec_decoding`` lower-cased (``none`` when empty), and under ``metrics`` every
  numeric field outside ``NON_METRIC_KEYS``.
"""

from __future__ import annotations

import math
from typing import Any

#: The environment ``process_result.py`` requires (and the optional ones it reads) on a single node.
RUNNER_ENV_KEYS = ("RUNNER_TYPE", "FRAMEWORK", "PRECISION", "SPEC_DECODING", "RESULT_FILENAME", "ISL", "OSL",
                   "DISAGG", "MODEL_PREFIX", "IMAGE", "TP", "EP_SIZE", "DP_ATTENTION")

#: The runner row's fields besides the renamed measurements (single node, no router or KV transfer).
RUNNER_FIELDS = ("hw", "conc", "image", "model", "infmax_model_prefix", "framework", "precision", "spec_decoding",
                 "disagg", "recipe_fingerprint", "isl", "osl", "is_multinode", "tp", "pp", "dcp_size", "pcp_size",
                 "ep", "dp_attention", "tput_per_gpu", "output_tput_per_gpu", "input_tput_per_gpu")

#: ``BenchmarkRow`` of the API, in its declared order.
API_FIELDS = ("hardware", "framework", "model", "precision", "spec_method", "disagg", "is_multinode", "prefill_tp",
              "prefill_ep", "prefill_dp_attention", "prefill_num_workers", "decode_tp", "decode_ep",
              "decode_dp_attention", "decode_num_workers", "num_prefill_gpu", "num_decode_gpu", "isl", "osl", "conc",
              "image", "metrics", "date", "run_url")

#: ``NON_METRIC_KEYS`` of benchmark-mapper.ts: runner fields that are not stored under ``metrics``.
NON_METRIC_KEYS = frozenset({"hw", "model", "framework", "precision", "infmax_model_prefix", "isl", "osl", "conc",
                             "image", "disagg", "is_multinode", "spec_decoding", "tp", "ep", "dp_attention",
                             "prefill_tp", "prefill_ep", "prefill_dp_attention", "prefill_num_workers", "decode_tp",
                             "decode_ep", "decode_dp_attention", "decode_num_workers", "num_prefill_gpu",
                             "num_decode_gpu"})


def runner_row(result: dict[str, Any], env: dict[str, str]) -> dict[str, Any]:
    """The flat row ``process_result.py`` writes for a ``vllm bench serve`` result on one node."""
    data: dict[str, Any] = {
        "hw": env["RUNNER_TYPE"], "conc": int(result["max_concurrency"]), "image": env["IMAGE"],
        "model": result["model_id"], "infmax_model_prefix": env["MODEL_PREFIX"], "framework": env["FRAMEWORK"],
        "precision": env["PRECISION"], "spec_decoding": env["SPEC_DECODING"],
        "disagg": env["DISAGG"].lower() == "true", "recipe_fingerprint": env.get("RECIPE_FINGERPRINT", ""),
        "isl": int(env["ISL"]), "osl": int(env["OSL"]),
    }
    tp, pp, dcp, pcp = int(env["TP"]), int(env.get("PP_SIZE", "1")), int(env.get("DCP_SIZE", "1")), \
        int(env.get("PCP_SIZE", "1"))
    gpus = tp * pp * pcp
    total, output = float(result["total_token_throughput"]), float(result["output_throughput"])
    data |= {"is_multinode": False, "tp": tp, "pp": pp, "dcp_size": dcp, "pcp_size": pcp, "ep": int(env["EP_SIZE"]),
             "dp_attention": env["DP_ATTENTION"], "tput_per_gpu": total / gpus, "output_tput_per_gpu": output / gpus,
             "input_tput_per_gpu": (total - output) / gpus}
    for key, value in result.items():
        if key.endswith("ms"):
            data[key.replace("_ms", "")] = float(value) / 1000.0
        if "tpot" in key:
            data[key.replace("_ms", "").replace("tpot", "intvty")] = 1000.0 / float(value)
    return data


def _number(value: Any) -> float | None:
    """``parseNum`` of normalizers.ts: numbers and numeric strings (``parseFloat``), booleans as 0/1."""
    if value is None:
        return None
    if isinstance(value, str):
        try:
            found = float(value.strip().split()[0]) if value.strip() else math.nan
        except ValueError:
            return None
        return None if math.isnan(found) else found
    if isinstance(value, (bool, int, float)):
        return float(value)
    return None


def api_row(row: dict[str, Any], *, model: str, hardware: str, date: str) -> dict[str, Any]:
    """The ``BenchmarkRow`` the API returns for a v1 runner row (``model``/``hardware``: the app's keys for it)."""
    tp, ep = int(row.get("tp", 1)), int(row.get("ep", 1))
    dp = row.get("dp_attention") in (True, "true", "True")
    spec = row.get("spec_decoding")
    metrics = {key: found for key, value in row.items() if key not in NON_METRIC_KEYS
               for found in [_number(value)] if found is not None}
    values = {"hardware": hardware, "framework": str(row["framework"]).lower(), "model": model,
              "precision": str(row["precision"]).lower(), "spec_method": str(spec).lower() if spec else "none",
              "disagg": row.get("disagg") in (True, "true", "True"),
              "is_multinode": row.get("is_multinode") in (True, "true", "True"),
              "prefill_tp": tp, "prefill_ep": ep, "prefill_dp_attention": dp, "prefill_num_workers": 0,
              "decode_tp": tp, "decode_ep": ep, "decode_dp_attention": dp, "decode_num_workers": 0,
              "num_prefill_gpu": tp * ep, "num_decode_gpu": tp * ep, "isl": int(row["isl"]), "osl": int(row["osl"]),
              "conc": int(row["conc"]), "image": str(row["image"]).replace("#", "/") if row.get("image") else None,
              "metrics": metrics, "date": date, "run_url": None}
    return {key: values[key] for key in API_FIELDS}
