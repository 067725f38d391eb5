"""Calibrating from what a vLLM deployment already records: its Prometheus metrics.

A vLLM server exports counters and histograms at ``/metrics`` (Prometheus'
text exposition format). Differences of those counters between two moments
give, for the requests that finished in between, their number, the sums of
their end-to-end latency, time to first token, time per output token, prompt
and output tokens, and speculative decoding's drafts and accepted tokens.
Windows at different loads are benchmark runs in all but name: each becomes
a :class:`~sdplan.runs.record.BenchmarkRun` (Little's law gives its load) and
goes through the same steady-state screen and the same fit.

Modules:

* :mod:`~sdplan.metrics.names`: which vLLM metric names (by version) map to which quantity;
* :mod:`~sdplan.metrics.series`: the time series of one server, read from either source, with counter resets,
  gaps and clocks going backwards handled;
* :mod:`~sdplan.metrics.textfile`: the scrape file (``sdplan scrape``'s output), streamed;
* :mod:`~sdplan.metrics.api`: a Prometheus HTTP API ``query_range`` export;
* :mod:`~sdplan.metrics.windows`: windows of a series as runs;
* :mod:`~sdplan.metrics.scrape`: recording scrapes from a live server;
* :mod:`~sdplan.metrics.prior`: scaling a calibration to reproduce the metrics (``fit --prior``).

None of them is imported by the planner; the exposition-format parser is the
maintained ``prometheus_client`` one, imported only when a scrape file is read.
"""
