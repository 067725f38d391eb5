"""Measuring the served system: what ``sdplan calibrate`` runs by default.

A calibration must predict the server users deploy, so it is measured on one:

* :mod:`~sdplan.measure.server`: ``vllm serve`` started on 127.0.0.1 and a free
  port, health-checked, its log kept, and always stopped (process group,
  SIGINT then SIGTERM then SIGKILL), also on Ctrl-C and failure;
* :mod:`~sdplan.measure.client`: vLLM's own ``vllm bench serve`` in one
  long-lived process, one ordinary result file per load point;
* :mod:`~sdplan.measure.quiet`: CPU time of processes that are not ours during
  each point (a concurrent CPU-bound process inflates vLLM's CPU steps 10-50x);
* :mod:`~sdplan.measure.sweep`: the plan of load points (closed-loop concurrency
  sweep per configuration, optional Poisson points), repeats and re-measures;
* :mod:`~sdplan.measure.store`: a resumable manifest of finished points.

Nothing here imports vLLM: it runs in subprocesses (:mod:`sdplan._vllm`).
The fit of the measured points is :mod:`sdplan.fit`, the same machinery as
``sdplan fit``.
"""
