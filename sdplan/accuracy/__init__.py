"""The served accuracy benchmark's analysis: what ``benchmarks/accuracy_served.py`` records, scores and pools.

The benchmark itself (``benchmarks/accuracy_served.py``) starts ``vllm serve``, calibrates and measures; what it
does with the measurements is here, pure and testable without vLLM:

* :mod:`~sdplan.accuracy.summary`: the benchmark's workloads, rates and time budget, the record of each run,
  the planner's picks, the summary per workload and over all, the goals, and pooling several benchmark runs'
  summaries (``accuracy_served.py --pool``);
* :mod:`~sdplan.accuracy.floors`: what the servers' spread leaves to any model: the floor under the E2E error
  and the regret against latencies pooled over runs;
* :mod:`~sdplan.accuracy.repredict`: a stored summary's predictions re-made by the current code from the run's
  calibration and result files, so that a pool judges one model.

Nothing here is imported by the ``sdplan`` command.
"""
