"""A discrete-event simulator of one serving replica with continuous batching and SD.

It shares its inputs with the analytic model (the calibration's coefficients
at the workload) and shows what the mean model cannot: tails, queueing, and
where the mean model stops being right. :mod:`sdplan.simulate.engine` runs one
replication (its docstring states the model), :mod:`sdplan.simulate.sampling`
draws the decode cycles, :mod:`sdplan.simulate.config` holds the inputs and
one replication's result, and :mod:`sdplan.simulate.replicate` the statistics
over replications.
"""

from sdplan.simulate.config import PERCENTILES, WARMUP_FRACTION, SimulationConfig, SimulationResult, is_steady
from sdplan.simulate.engine import arrival_times, simulate
from sdplan.simulate.replicate import METRICS, STATISTICS, Estimate, RateSummary, replicate, t_quantile
from sdplan.simulate.sampling import UNIFORM_BLOCK, cycles_needed

__all__ = [
    "METRICS", "PERCENTILES", "STATISTICS", "UNIFORM_BLOCK", "WARMUP_FRACTION", "Estimate", "RateSummary",
    "SimulationConfig", "SimulationResult", "arrival_times", "cycles_needed", "is_steady", "replicate", "simulate",
    "t_quantile",
]
