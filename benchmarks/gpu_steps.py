#!/usr/bin/env python3
"""Time a derived calibration's steps on a GPU with torch, and check its step curve against them.

Usage, on two machines::

    python benchmarks/gpu_steps.py prepare CALIBRATION -o gpu-job.json      # here: sdplan, aiconfigurator-core
    python benchmarks/gpu_steps.py measure gpu-job.json [...] -o FOLDER     # on the GPU: torch only
    python benchmarks/gpu_steps.py compare gpu-job.json FOLDER/NAME.steps.json   # here: sdplan

or, for step timings measured elsewhere (a profiler, an engine's own step timer)::

    python benchmarks/gpu_steps.py score CALIBRATION timings.csv [--engine-steps]

``prepare`` reads a derived, dense, bf16 calibration and writes what the GPU must run: the target's and the
draft's shapes (from the config.json that ``sdplan derive`` priced, AIConfigurator's or
``sdplan.derive.request.ARCHITECTURES``), one tensor-parallel shard of them, and the grid of batches ``B``,
query tokens per sequence ``q`` (1 for a decode step, ``k + 1`` for the verification of ``k`` drafts) and
KV context ``s``. ``measure`` needs nothing but torch and the standard library (the device machine has no
sdplan, vLLM or network): it builds the shard with random weights and times, with CUDA graphs, per grid
point

* the whole forward step (RMSNorm, QKV, attention over ``s + q`` cached keys with scaled_dot_product_attention,
  output projection, gated MLP, the LM head over the ``B q`` rows), and
* its GEMMs alone (the same linear layers over the same rows, nothing else),

and the draft's step (a draft LM, or an EAGLE head priced as ``derive`` prices it: one decoder layer of the
target's shapes, QKV input of twice the hidden size, the head's own vocabulary). ``compare`` prices the same
steps with the calibration's ``[step_model]`` (``T(B, q, s) = fixed + B (seq + q tok + s ctx) + knee``,
:func:`sdplan.calibration.scaling.coefficients_from_steps`; the engine's host overheads are not device work
and are left out) and reports

1. **the physical floor**: every priced step at least the GEMMs' measured time. The engine runs the same
   cuBLAS GEMMs for unquantised linear layers, so a price below them is a step no engine can run;
2. **the shape of the knee**: the priced and measured verification-over-decode ratios
   ``T(B, k + 1, s) / T(B, 1, s)``, which set SD's speedup at batch ``B``;
3. the priced step over the measured forward, per point (torch's unfused norms and activations make the
   measured forward an upper reference, not the engine's time).

What it leaves out, on purpose: the all-reduce of a tensor-parallel step (one shard is timed: a lower
bound of each GPU's work), rotary embeddings and sampling (element-wise, small next to the GEMMs), and the
causal mask among a verification's ``q`` new tokens (it changes which scores are kept, not the work).
A calibration of another GPU than the one measured is compared all the same and said so: an H100's steps
cannot be faster than an H200's (the same GH100 compute, less bandwidth), so the floor still binds.
Never a product dependency and never in CI: it runs where a GPU is lent (``benchmarks/RESULTS-gpu-steps-2026-11.md``).

``score`` holds any calibration with a ``[step_model]`` against step timings in a CSV (``TIMINGS_CSV`` below,
in seconds, or ``step_ms``/``gemm_ms`` in milliseconds):
the same per-point ratios, the verification-over-decode ratios and, where ``gemm_s`` is given, the floor.
Timings of whole engine steps (host time included) are compared with ``--engine-steps``, which adds the
file's ``[step_model.engine] step_overhead_s`` to every priced step.
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import statistics
import sys
import time
from pathlib import Path
from typing import Any

#: Batches, query tokens per sequence (k = q - 1) and contexts timed by default.
BATCHES = (1, 2, 4, 8, 16, 32, 64, 128, 256)
QUERY_TOKENS = (1, 2, 4, 6)
CONTEXTS = (1024, 4096)
#: KV cache the GPU may hold for one grid point (GiB): larger (B, s) points are skipped and listed.
KV_BUDGET_GIB = 48.0
#: Replays timed per repeat, and repeats (the median repeat is kept).
ITERATIONS, REPEATS = 10, 3
JOB_SCHEMA = 1


# ----------------------------------------------------------------------------- prepare (here)

def _config(name: str) -> dict[str, Any]:
    """The config.json ``sdplan derive`` priced ``name`` with: its own architecture table, or AIConfigurator's
    (``sdplan.derive.pricing.model_config_json``, the name resolved as derive resolves it)."""
    from sdplan.derive.pricing import model_config_json

    config = model_config_json(name)
    if config is None:
        raise SystemExit(f"gpu_steps: no config.json for {name} (neither AIConfigurator's model_configs nor "
                         "sdplan.derive.request.ARCHITECTURES has it, and it is not a folder with one)")
    return config


def _shapes(config: dict[str, Any], tp: int) -> dict[str, int]:
    """One tensor-parallel shard of a dense decoder: heads, KV heads and the MLP split ``tp`` ways."""
    if config.get("num_experts") or config.get("num_local_experts") or config.get("n_routed_experts"):
        raise SystemExit("gpu_steps: mixture-of-experts targets are not timed (dense decoders only)")
    heads, kv_heads = int(config["num_attention_heads"]), int(config.get("num_key_value_heads",
                                                                         config["num_attention_heads"]))
    hidden = int(config["hidden_size"])
    return {"hidden": hidden, "heads": max(1, heads // tp), "kv_heads": max(1, kv_heads // tp),
            "head_dim": int(config.get("head_dim") or hidden // heads),
            "intermediate": int(config["intermediate_size"]) // tp, "layers": int(config["num_hidden_layers"]),
            "vocab": int(config["vocab_size"]) // tp, "qkv_input": hidden}


def prepare(calibration_name: str, out: Path, batches: tuple[int, ...], query_tokens: tuple[int, ...],
            contexts: tuple[int, ...]) -> int:
    from sdplan.calibration import resolve_calibration
    from sdplan.derive.request import EAGLE3_DRAFT_VOCAB

    calibration = resolve_calibration(calibration_name)
    document = calibration.document
    derivation, provenance = document.get("derivation") or {}, document["provenance"]
    if "step_model" not in document or not derivation:
        raise SystemExit(f"gpu_steps: {calibration_name} is not a derived calibration with a [step_model]")
    if derivation.get("precision") != "bf16":
        raise SystemExit(f"gpu_steps: {calibration_name} is priced at {derivation.get('precision')}; the torch "
                         "steps are bf16 GEMMs, so only bf16 calibrations are compared")
    tp = int(provenance.get("tensor_parallel_size", 1))
    target = _shapes(_config(derivation["target_priced_as"]), tp)
    method = provenance.get("speculative_method")
    draft: dict[str, int] | None = None
    if method in ("eagle", "eagle3"):  # one decoder layer of the target's shapes, QKV over [embedding, feature]
        draft = dict(target, layers=1, qkv_input=2 * target["hidden"],
                     vocab=EAGLE3_DRAFT_VOCAB if method == "eagle3" else target["vocab"])
    elif method == "draft_model":
        draft = _shapes(_config(provenance["draft_model"]), 1)  # derive runs a draft LM at TP 1 (draft_tp)
    job = {"schema": JOB_SCHEMA, "calibration": calibration_name, "system": derivation.get("system"),
           "hardware": provenance.get("hardware"), "method": method, "tensor_parallel_size": tp,
           "target": target, "draft": draft, "batches": list(batches), "query_tokens": list(query_tokens),
           "contexts": list(contexts)}
    out.write_text(json.dumps(job, indent=1) + "\n")
    print(f"wrote {out}: {len(batches)} batches x {len(query_tokens)} query lengths x {len(contexts)} contexts"
          f" of {calibration_name}'s target shard{' and its draft' if draft else ''}")
    return 0


# ----------------------------------------------------------------------------- measure (on the GPU, torch only)

class Shard:
    """One tensor-parallel shard of a dense decoder with random bf16 weights and a KV cache."""

    def __init__(self, torch: Any, shapes: dict[str, int], device: str, dtype: Any) -> None:
        self.torch, self.shapes, self.device, self.dtype = torch, shapes, device, dtype
        h, heads, kv, d = shapes["hidden"], shapes["heads"], shapes["kv_heads"], shapes["head_dim"]

        def weight(rows: int, cols: int) -> Any:
            return torch.randn(rows, cols, device=device, dtype=dtype) / math.sqrt(rows)

        self.layers = [{"qkv": weight(shapes["qkv_input"], (heads + 2 * kv) * d), "o": weight(heads * d, h),
                        "gate_up": weight(h, 2 * shapes["intermediate"]), "down": weight(shapes["intermediate"], h),
                        "norm": torch.ones(h, device=device, dtype=dtype)} for _ in range(shapes["layers"])]
        self.lm_head = weight(h, shapes["vocab"])
        self.cache: list[tuple[Any, Any]] = []
        major, minor = (int(part) for part in torch.__version__.split(".")[:2])
        self.native_gqa = (major, minor) >= (2, 5)  # scaled_dot_product_attention(enable_gqa=...)

    def allocate(self, batch: int, length: int) -> None:
        """A KV cache of ``batch`` sequences of ``length`` positions per layer (reused across smaller points)."""
        self.cache = []
        if self.device == "cuda":
            self.torch.cuda.empty_cache()
        kv, d = self.shapes["kv_heads"], self.shapes["head_dim"]
        for _ in self.layers:
            self.cache.append((self.torch.zeros(batch, kv, length, d, device=self.device, dtype=self.dtype),
                               self.torch.zeros(batch, kv, length, d, device=self.device, dtype=self.dtype)))

    def release(self) -> None:
        """Give the weights and the cache back before the next model is built."""
        self.layers, self.cache, self.lm_head = [], [], None
        if self.device == "cuda":
            self.torch.cuda.empty_cache()

    def inputs(self, batch: int, query: int) -> Any:
        width = self.shapes["qkv_input"]
        return self.torch.randn(batch * query, width, device=self.device, dtype=self.dtype)

    def _norm(self, x: Any, weight: Any) -> Any:
        return x * self.torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + 1e-5).to(x.dtype) * weight

    def forward(self, x: Any, batch: int, query: int, context: int) -> Any:
        """The whole step: ``B q`` rows through every layer and the LM head, attention over ``s + q`` keys."""
        f = self.torch.nn.functional
        heads, kv, d, h = self.shapes["heads"], self.shapes["kv_heads"], self.shapes["head_dim"], self.shapes["hidden"]
        hidden = x[:, :h]  # the residual stream; an EAGLE head's input is [embedding, feature], twice as wide
        layer_input = x
        for layer, (k_cache, v_cache) in zip(self.layers, self.cache):
            normed = self._norm(layer_input, layer["norm"] if layer_input.shape[1] == h else 1.0)
            q, k, v = (normed @ layer["qkv"]).split([heads * d, kv * d, kv * d], dim=-1)
            k_cache[:batch, :, context:context + query] = k.view(batch, query, kv, d).transpose(1, 2)
            v_cache[:batch, :, context:context + query] = v.view(batch, query, kv, d).transpose(1, 2)
            keys, values = k_cache[:batch, :, :context + query], v_cache[:batch, :, :context + query]
            if heads != kv and not self.native_gqa:  # torch < 2.5: every query head its own copy of the KV
                keys, values = keys.repeat_interleave(heads // kv, 1), values.repeat_interleave(heads // kv, 1)
            scores = f.scaled_dot_product_attention(q.view(batch, query, heads, d).transpose(1, 2), keys, values,
                                                    **({"enable_gqa": heads != kv} if self.native_gqa else {}))
            hidden = hidden + scores.transpose(1, 2).reshape(batch * query, heads * d) @ layer["o"]
            gate, up = (self._norm(hidden, layer["norm"]) @ layer["gate_up"]).chunk(2, dim=-1)
            hidden = hidden + (f.silu(gate) * up) @ layer["down"]
            layer_input = hidden
        return self._norm(hidden, 1.0) @ self.lm_head

    def gemm_inputs(self, rows: int) -> list[Any]:
        """Activations of each GEMM's input width for ``rows`` token rows (their values do not matter)."""
        widths = (self.shapes["qkv_input"], self.shapes["heads"] * self.shapes["head_dim"], self.shapes["hidden"],
                  self.shapes["intermediate"])
        return [self.torch.randn(rows, width, device=self.device, dtype=self.dtype) for width in widths]

    def gemms(self, inputs: list[Any]) -> Any:
        """The step's GEMMs alone: QKV, output, gate/up and down of every layer and the LM head, on the same rows."""
        into_qkv, into_o, into_mlp, into_down = inputs
        for layer in self.layers:
            into_qkv @ layer["qkv"]
            into_o @ layer["o"]
            into_mlp @ layer["gate_up"]
            into_down @ layer["down"]
        return into_mlp @ self.lm_head


def _time(torch: Any, step: Any, device: str, graphs: bool, iterations: int, repeats: int) -> float:
    """Median over ``repeats`` of the mean seconds of ``iterations`` runs of ``step`` (replays of its CUDA graph)."""
    if device != "cuda":
        step()
        means = []
        for _ in range(repeats):
            start = time.perf_counter()
            for _ in range(iterations):
                step()
            means.append((time.perf_counter() - start) / iterations)
        return statistics.median(means)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            step()
    torch.cuda.current_stream().wait_stream(side)
    run = step
    if graphs:
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            step()
        run = graph.replay
    means = []
    for _ in range(repeats):
        begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        begin.record()
        for _ in range(iterations):
            run()
        end.record()
        torch.cuda.synchronize()
        means.append(begin.elapsed_time(end) / 1e3 / iterations)
    return statistics.median(means)


def _measure_model(torch: Any, shapes: dict[str, int], job: dict[str, Any], queries: list[int], args: Any,
                   label: str) -> tuple[list[dict[str, Any]], list[str]]:
    shard = Shard(torch, shapes, args.device, torch.bfloat16)
    kv_bytes = 2 * shapes["layers"] * shapes["kv_heads"] * shapes["head_dim"] * 2  # K and V, bf16, per position
    points, skipped = [], []
    for context in job["contexts"]:
        fits = [b for b in job["batches"] if b * (context + max(queries)) * kv_bytes <= args.kv_budget_gib * 2**30]
        skipped += [f"{label} B={b} s={context}" for b in job["batches"] if b not in fits]
        if not fits:
            continue
        shard.allocate(max(fits), context + max(queries))
        for batch in fits:
            for query in queries:
                x = shard.inputs(batch, query)
                with torch.inference_mode():
                    step_s = _time(torch, functools.partial(shard.forward, x, batch, query, context), args.device,
                                   not args.no_graphs, args.iterations, args.repeats)
                    gemm_s = _time(torch, functools.partial(shard.gemms, shard.gemm_inputs(batch * query)),
                                   args.device, not args.no_graphs, args.iterations, args.repeats)
                points.append({"model": label, "batch": batch, "query_tokens": query, "context_tokens": context,
                               "step_s": step_s, "gemm_s": gemm_s})
                print(f"{label} B={batch:4d} q={query} s={context}: step {1e3 * step_s:8.3f} ms, "
                      f"GEMMs {1e3 * gemm_s:8.3f} ms", flush=True)
    shard.release()
    return points, skipped


def tiny(shapes: dict[str, int]) -> dict[str, int]:
    """The same decoder at 1/32 of its widths and at most two layers (an EAGLE head's wider QKV input kept)."""
    small = {name: max(8, shapes[name] // 32) for name in ("hidden", "intermediate", "vocab", "head_dim")}
    return dict(shapes, **small, layers=min(2, shapes["layers"]),
                qkv_input=small["hidden"] * shapes["qkv_input"] // shapes["hidden"])


def measure(job_paths: list[Path], out_folder: Path, args: Any) -> int:
    """Time every job's steps and write ``<calibration>.steps.json`` per job into ``out_folder``; a target (or
    draft) of the same shapes and grid as an earlier job's is timed once."""
    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("gpu_steps: no CUDA device; run on the GPU machine, or --device cpu to check the code path")
    out_folder.mkdir(parents=True, exist_ok=True)
    timed: dict[str, tuple[list[dict[str, Any]], list[str]]] = {}
    for job_path in job_paths:
        job = json.loads(job_path.read_text())
        if job.get("schema") != JOB_SCHEMA:
            raise SystemExit(f"gpu_steps: {job_path} is not a job of schema {JOB_SCHEMA} (write it with 'prepare')")
        if args.tiny:  # the code path on a CPU: widths / 32, two layers
            job.update({key: tiny(job[key]) for key in ("target", "draft") if job[key]})
        started = time.time()
        points, skipped = [], []
        for label, queries in (("target", job["query_tokens"]), ("draft", [1])):
            if not job[label]:
                continue
            key = json.dumps([label, job[label], job["batches"], queries, job["contexts"]], sort_keys=True)
            if key not in timed:
                timed[key] = _measure_model(torch, job[label], job, queries, args, label)
            points, skipped = points + timed[key][0], skipped + timed[key][1]
        device = torch.cuda.get_device_name() if args.device == "cuda" else "cpu"
        result = {"schema": JOB_SCHEMA, "job": job["calibration"], "device": device, "torch": torch.__version__,
                  "cuda_graphs": args.device == "cuda" and not args.no_graphs, "tiny": bool(args.tiny),
                  "iterations": args.iterations, "repeats": args.repeats, "seconds": round(time.time() - started, 1),
                  "skipped": skipped, "points": points}
        out = out_folder / f"{Path(job['calibration']).name.removesuffix('.toml')}.steps.json"
        out.write_text(json.dumps(result, indent=1) + "\n")
        print(f"wrote {out}: {len(points)} points on {device} in {result['seconds']} s"
              + (f"; skipped (KV cache over {args.kv_budget_gib:g} GiB): {', '.join(skipped)}" if skipped else ""),
              flush=True)
    return 0


# ----------------------------------------------------------------------------- compare (here)

def priced_step_s(steps: Any, which: str, batch: int, query: int, context: int, moe: Any = None) -> float:
    """The calibration's device time of one step: ``T(B, q, s)`` of ``[step_model.target]`` or ``.draft``,
    with the target's compute-bound knee on its ``B q`` rows (:func:`sdplan.latency.knee.step_excess_s`) and, for
    an MoE target (``moe``, :class:`sdplan.latency.moe.MoESpec`), the experts its ``B q`` routed tokens touch:
    ``phi(B q)`` times the coverage increments of a decode step or a verification, as ``sdplan show`` prices
    them (:func:`sdplan.latency.model.step_times`)."""
    from sdplan.calibration.scaling import coefficients_from_steps
    from sdplan.latency.knee import step_excess_s

    cost = steps.target if which == "target" else steps.draft
    if which != "target":
        return cost.at(batch, query, context)
    # coefficients at a mean context of s (p + g/2) carry the file's knee as it is
    knee = float(step_excess_s(coefficients_from_steps(steps, context - 1.0, 2.0), batch * query))
    experts = 0.0
    if moe is not None:
        fixed, other = ("c1v_s", "c2v_s") if query > 1 else ("baseline_c1_step_s", "baseline_c2_step_s")
        experts = float(moe.phi(batch * query)) * (moe.coverage.get(fixed, 0.0)
                                                   + (batch - 1) * moe.coverage.get(other, 0.0))
    return cost.at(batch, query, context) + knee + experts


def report_steps(steps: Any, points: list[dict[str, Any]], moe: Any = None, host_s: float = 0.0) -> list[str]:
    """Print each measured step beside its priced time (:func:`priced_step_s` plus ``host_s``, the engine's host
    time for whole engine steps), their MAPE and bias, the verification-over-decode ratios where a decode step of
    the same batch and context was measured, and the steps priced below their measured GEMMs (``gemm_s``, where
    given); return those steps."""
    gemms = any(point.get("gemm_s") is not None for point in points)
    print(f"{'model':6} {'B':>4} {'q':>2} {'s':>6} {'priced ms':>10} {'measured ms':>11} "
          + (f"{'GEMMs ms':>9} " if gemms else "") + f"{'priced/measured':>15}")
    errors, rows, below = [], {}, []
    for point in sorted(points, key=lambda p: (p["model"], p["context_tokens"], p["batch"], p["query_tokens"])):
        model, batch, query, context = point["model"], point["batch"], point["query_tokens"], point["context_tokens"]
        priced = priced_step_s(steps, model, batch, query, context, moe) + host_s
        rows[(model, batch, query, context)] = (priced, point["step_s"])
        errors.append(priced / point["step_s"] - 1.0)
        gemm = point.get("gemm_s")
        print(f"{model:6} {batch:4d} {query:2d} {context:6d} {1e3 * priced:10.3f} {1e3 * point['step_s']:11.3f} "
              + ((f"{1e3 * gemm:9.3f} " if gemm is not None else f"{'-':>9} ") if gemms else "")
              + f"{priced / point['step_s']:15.2f}")
        if gemm is not None and priced - host_s < gemm:
            below.append(f"{model} B={batch} q={query} s={context}")
    print(f"\n{len(errors)} steps: MAPE {100 * statistics.fmean(abs(e) for e in errors):.1f}%, "
          f"bias {100 * statistics.fmean(errors):+.1f}%, worst {100 * max(errors, key=abs):+.1f}%")
    ratios = [(key, value) for key, value in rows.items() if key[0] == "target" and key[2] > 1
              and ("target", key[1], 1, key[3]) in rows]
    if ratios:
        print("verification over decode, T(B, k+1, s) / T(B, 1, s): priced / measured")
        for (_, batch, query, context), (priced, measured) in ratios:
            base_priced, base_measured = rows[("target", batch, 1, context)]
            priced_ratio, measured_ratio = priced / base_priced, measured / base_measured
            print(f"  B={batch:4d} k={query - 1} s={context:6d}: {priced_ratio:5.2f} / {measured_ratio:5.2f} "
                  f"({100 * (priced_ratio / measured_ratio - 1):+.0f}%)")
    if gemms:
        print(f"steps priced below their GEMMs' measured time: {len(below)}" + (f" ({', '.join(below)})" if below
                                                                                 else ""))
    return below


def compare(job_path: Path, measured_path: Path) -> int:
    from sdplan.calibration import resolve_calibration
    from sdplan.calibration.records import StepModel

    job, measured = json.loads(job_path.read_text()), json.loads(measured_path.read_text())
    steps = StepModel.from_table(resolve_calibration(job["calibration"]).document["step_model"])
    print(f"{job['calibration']} ({job['hardware']}) against {measured['device']}, torch {measured['torch']}, "
          f"CUDA graphs {'on' if measured['cuda_graphs'] else 'off'}"
          + ("; TINY SHAPES: the code path only, not a measurement of the calibration" if measured["tiny"] else ""))
    if measured["tiny"] or measured["device"] == "cpu":
        print("  (the floor and ratios below compare a GPU calibration with CPU timings: meaningless as figures)")
    below = report_steps(steps, measured["points"])
    if measured["skipped"]:
        print(f"not timed (KV cache over the budget): {', '.join(measured['skipped'])}")
    return 1 if below and not measured["tiny"] else 0


#: ``score``'s CSV: one step timing a row. ``model`` (target or draft) and ``gemm_s`` (the step's GEMMs alone)
#: may be left out; a draft row's ``query_tokens`` is 1. The times may be given in milliseconds instead, as
#: profilers print them: ``step_ms`` and ``gemm_ms`` (one unit a file, named in the header).
TIMINGS_CSV = ("batch", "query_tokens", "context_tokens", "step_s")
TIMINGS_OPTIONAL = ("model", "gemm_s")
#: Seconds per unit of a time column, by the suffix of its name.
TIME_UNITS = {"_s": 1.0, "_ms": 1e-3}


def _time_columns(header: list[str], path: Path) -> tuple[str, str, float]:
    """The step and GEMM columns of a timing CSV and their unit in seconds: ``step_s``/``gemm_s`` or
    ``step_ms``/``gemm_ms``; SystemExit where the header gives both units or neither."""
    given = [suffix for suffix in TIME_UNITS if f"step{suffix}" in header]
    if len(given) != 1:
        raise SystemExit(f"gpu_steps: {path} " + ("gives both step_s and step_ms; keep one unit" if given else
                         f"lacks a step time column (step_s, or step_ms in milliseconds; need "
                         f"{','.join(TIMINGS_CSV)}, optional {','.join(TIMINGS_OPTIONAL)})"))
    suffix = given[0]
    return f"step{suffix}", f"gemm{suffix}", TIME_UNITS[suffix]


def read_timings(path: Path) -> list[dict[str, Any]]:
    """The rows of a step-timing CSV as ``measure`` writes its points, or SystemExit naming the row and column."""
    import csv

    try:
        with path.open(newline="") as handle:
            rows = list(csv.DictReader(handle))
    except (OSError, UnicodeDecodeError, csv.Error) as error:
        raise SystemExit(f"gpu_steps: cannot read {path}: {error}") from None
    if not rows:
        raise SystemExit(f"gpu_steps: {path} has no rows; give a header {','.join(TIMINGS_CSV)} and one row a step")
    header = [name.strip() for name in rows[0]]
    missing = [column for column in TIMINGS_CSV[:-1] if column not in header]
    if missing:
        raise SystemExit(f"gpu_steps: {path} lacks the column(s) {', '.join(missing)} (need {','.join(TIMINGS_CSV)}; "
                         f"optional {','.join(TIMINGS_OPTIONAL)})")
    step, gemm, unit = _time_columns(header, path)
    rows = [{(key or "").strip(): value for key, value in row.items()} for row in rows]
    points = []
    for number, row in enumerate(rows, start=2):
        model = (row.get("model") or "target").strip().lower()
        if model not in ("target", "draft"):
            raise SystemExit(f"gpu_steps: {path} line {number}: model is {row['model']!r}; write target or draft")
        try:
            point = {"model": model, "batch": int(row["batch"]), "query_tokens": int(row["query_tokens"]),
                     "context_tokens": int(row["context_tokens"]), "step_s": float(row[step]) * unit,
                     "gemm_s": float(row[gemm]) * unit if (row.get(gemm) or "").strip() else None}
        except (TypeError, ValueError):
            raise SystemExit(f"gpu_steps: {path} line {number}: batch, query_tokens and context_tokens must be whole "
                             f"numbers and {step} ({gemm}) a number") from None
        if min(point["batch"], point["query_tokens"], point["context_tokens"]) < 1 or not (
                math.isfinite(point["step_s"]) and point["step_s"] > 0):
            raise SystemExit(f"gpu_steps: {path} line {number}: batch, query_tokens and context_tokens must be at "
                             f"least 1 and {step} a positive time")
        points.append(point)
    return points


def score(calibration_name: str, timings: Path, engine_steps: bool) -> int:
    """A calibration's ``[step_model]`` against step timings measured elsewhere (``TIMINGS_CSV``)."""
    from sdplan.calibration import resolve_calibration
    from sdplan.calibration.records import StepModel
    from sdplan.errors import SdplanError

    try:
        calibration = resolve_calibration(calibration_name)
    except SdplanError as error:
        raise SystemExit(f"gpu_steps: {error}") from None
    if "step_model" not in calibration.document:
        raise SystemExit(f"gpu_steps: {calibration_name} has no [step_model] to price steps with (a derived or "
                         "step-model file)")
    steps = StepModel.from_table(calibration.document["step_model"])
    reference = calibration.records.reference
    moe = calibration.moe_at(reference.prompt_tokens, reference.output_tokens)  # None for a dense target
    points = read_timings(timings)
    host = steps.step_overhead_s if engine_steps else 0.0
    print(f"{calibration_name} ({calibration.provenance.get('hardware')}) against {timings.name}: "
          + (f"whole engine steps (priced with the engine's {1e3 * host:.2f} ms a step)" if engine_steps
             else "device time (priced without the engine's host overhead)"))
    return 1 if report_steps(steps, points, moe, host) else 0


def _ints(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in text.split(","))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    p = commands.add_parser("prepare", help="write the job for a calibration (here)")
    p.add_argument("calibration")
    p.add_argument("-o", "--output", type=Path, default=Path("gpu-job.json"))
    p.add_argument("--batches", type=_ints, default=BATCHES)
    p.add_argument("--query-tokens", type=_ints, default=QUERY_TOKENS, help="k + 1 per verification; 1: decode")
    p.add_argument("--contexts", type=_ints, default=CONTEXTS)
    m = commands.add_parser("measure", help="time the job's steps (on the GPU; torch only)")
    m.add_argument("jobs", type=Path, nargs="+")
    m.add_argument("-o", "--output", type=Path, default=Path("gpu-steps"), help="folder of the measured files")
    m.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    m.add_argument("--no-graphs", action="store_true", help="time eagerly (CUDA graphs by default)")
    m.add_argument("--tiny", action="store_true", help="every width / 32, two layers: the code path on a CPU")
    m.add_argument("--iterations", type=int, default=ITERATIONS)
    m.add_argument("--repeats", type=int, default=REPEATS)
    m.add_argument("--kv-budget-gib", type=float, default=KV_BUDGET_GIB)
    c = commands.add_parser("compare", help="the calibration's steps against the measured ones (here)")
    c.add_argument("job", type=Path)
    c.add_argument("measured", type=Path)
    t = commands.add_parser("score", help="a calibration's steps against step timings in a CSV (here)")
    t.add_argument("calibration", help="a calibration file or shipped name with a [step_model]")
    t.add_argument("timings", type=Path,
                   help=f"CSV with columns {','.join(TIMINGS_CSV)} (optional {','.join(TIMINGS_OPTIONAL)})")
    t.add_argument("--engine-steps", action="store_true",
                   help="the timings are whole engine steps: add the file's host overhead a step")
    args = parser.parse_args(argv)
    if args.command == "prepare":
        return prepare(args.calibration, args.output, args.batches, args.query_tokens, args.contexts)
    if args.command == "measure":
        return measure(args.jobs, args.output, args)
    if args.command == "score":
        return score(args.calibration, args.timings, args.engine_steps)
    return compare(args.job, args.measured)


if __name__ == "__main__":
    sys.exit(main())
