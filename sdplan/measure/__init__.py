"""Measuring the served system: what ``sdplan calibrate`` runs by default.

A calibration must predict the server users deploy, so it is measured on one:

* :mod:`~sdplan.measure.server`: ``vllm serve`` started on 127.0.0.1 and a free
  port, health-checked, its log kept, and always stopped (process group,
  SIGINT then SIGTERM then SIGKILL), also on Ctrl-C and failure;
* :mod:`~sdplan.measure.client`: vLLM's own ``vllm bench serve`` in one
  long-lived process, one ordinary result file per load point;
* :mod:`~sdplan.measure.quiet`: CPU time of processes that are not ours during
  each point (a concurrent CPU-bound process inflates vLLM's CPU steps 10-50x);
* :mod:`~sdplan.measure.levels`: the plan's rules (grids, configurations,
  closed-loop levels, when a sweep stops, repeats that disagree), pure functions;
* :mod:`~sdplan.measure.sweep`: runs that plan against a live server, per
  configuration and round, re-measures included;
* :mod:`~sdplan.measure.store`: a resumable manifest of finished points;
* :mod:`~sdplan.measure.options`: the options of a served calibration, checked
  before any process starts;
* :mod:`~sdplan.measure.run`: a server per configuration, round after round;
* :mod:`~sdplan.measure.document`: the fit of the points and the calibration
  document;
* :mod:`~sdplan.measure.calibrate`: both methods end to end, what the CLI calls
  (measure, fit, check, write; when a fit is poor).

Beside calibrate's measurement, the use cases that start from result files
measured elsewhere: :mod:`~sdplan.measure.fit_runs` (``sdplan fit``) and
:mod:`~sdplan.measure.validate_runs` (``sdplan validate``), with their shared
options :mod:`~sdplan.measure.result_files`.

:mod:`~sdplan.measure.engine` is the other method, ``--method engine``: bare
engine steps timed in-process (:mod:`sdplan._vllm`) and fitted by
:mod:`sdplan.measure.stepfit`.

Nothing here imports vLLM: it runs in subprocesses, or in-process for the engine
method, both started from :mod:`sdplan._vllm`.
The fit of the measured points is :mod:`sdplan.fitting.fit`, the same machinery as
``sdplan fit``.
"""
