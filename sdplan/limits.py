"""Work budgets: refuse a request that would take minutes or gigabytes before anything is allocated.

Every command checks the size of what it is asked to compute against a
budget *before* it allocates: the planner's grid (rates x draft lengths x
acceptances), the capacity schedule (batch sizes x draft lengths), the
simulator's total requests (requests x replications x runs) and its memory.
A request over budget is a usage error (exit 2) whose message gives the
size, the limit, what to ask for instead, and the environment variable
``SDPLAN_WORK_LIMIT`` that scales every budget for a large job on purpose.

Domain bounds on single values (a draft length, a token count, a batch size)
live here too, so that the command line and the file schemas agree.

This module imports neither numpy nor click: ``sdplan --help`` uses it.
"""

from __future__ import annotations

import math
import os

from sdplan.errors import InvalidValueError

#: Environment variable multiplying every budget below (default 1).
WORK_LIMIT_ENV = "SDPLAN_WORK_LIMIT"

#: Points of the planner grid: rates x draft lengths x acceptances (about 2 s, 250 MB and 40 MB of JSON).
MAX_GRID_POINTS = 100_000
#: Rows and tables of one terminal report (rich draws about 1000 rows or 50 tables a second).
MAX_TABLE_ROWS = 5_000
MAX_TABLES = 100
#: Requests simulated in total: requests x replications x runs (rates, or bisection steps x options); ~1 min.
MAX_SIMULATED_REQUESTS = 1_000_000
#: Setup cost of one simulation run, counted in requests (about 2.5 ms, as long as 40 requests take).
RUN_OVERHEAD_REQUESTS = 50
#: Peak memory of one replication of the simulator, bytes.
MAX_SIMULATION_BYTES = 2 * 2**30

#: Longest draft length, tokens (SD drafts a handful of tokens; vLLM's largest configurations use tens).
MAX_DRAFT_LENGTH = 1024
#: Longest draft length calibrate serves and derive prices, tokens: configurations a server can run.
MAX_SERVED_DRAFT_LENGTH = 64
#: Longest prompt or output, tokens (ten times the largest context windows offered today).
MAX_TOKENS = 100_000_000
#: Largest batch size (vLLM max_num_seqs).
MAX_BATCH_SIZE = 1_000_000
#: Highest request rate, req/s: far past any replica. A result file's rates above it are refused (a mistyped
#: or corrupted field: with 1e308 req/s the load lambda L of a run overflows the fit), and the simulator
#: draws arrivals no faster, far enough below the float range that the gaps do not underflow (at 1e308
#: req/s they all round to one instant).
MAX_RATE_RPS = 1e9
MAX_SIMULATED_RATE_RPS = MAX_RATE_RPS
#: Longest mean latency a result file may give, s (about 4 months): with the rate and token bounds it keeps
#: every product the fit forms (lambda L, tokens x seconds) inside the float range.
MAX_LATENCY_S = 1e7
#: Lowest request rate the simulator draws arrivals at, req/s (one request in about 30 years): below it the
#: arrival times and the trace's spans overflow the float range.
MIN_SIMULATED_RATE_RPS = 1e-9
#: Most requests in one replication of the simulator, and most replications.
MAX_REQUESTS = 10_000_000
MAX_REPLICATIONS = 1_000

#: Bytes the simulator holds per request besides its cycle draws (arrival, lengths, times, ids).
_BYTES_PER_REQUEST = 200
#: Bytes per drawn cycle per request: uniforms, accepted counts, sums, flags, plus one byte per draft position.
_BYTES_PER_CYCLE = 33


def work_limit() -> float:
    """The factor from ``SDPLAN_WORK_LIMIT`` (default 1).

    Raises
    ------
    InvalidValueError
        If the variable is set to anything but a positive finite number.
    """
    text = os.environ.get(WORK_LIMIT_ENV, "").strip()
    if not text:
        return 1.0
    try:
        factor = float(text)
    except ValueError:
        factor = math.nan
    if not (math.isfinite(factor) and factor > 0):
        raise InvalidValueError(f"{WORK_LIMIT_ENV}={text!r} is not a positive number; unset it or write e.g. 10")
    return factor


def _over(size: float, base_limit: float) -> str:
    """The way round for someone who means it: the factor that would let ``size`` through."""
    needed = math.ceil(size / base_limit * 10) / 10
    return f"set {WORK_LIMIT_ENV}={needed:g} to run it anyway"


def check_grid(points: int, description: str, fix: str) -> None:
    """Refuse a grid of more than ``MAX_GRID_POINTS`` (scaled) points.

    ``description`` says what multiplies into ``points`` (e.g. "1000 rates x
    300 draft lengths x 1 acceptance"); ``fix`` what to ask for instead.
    """
    limit = MAX_GRID_POINTS * work_limit()
    if points > limit:
        raise InvalidValueError(
            f"{points:,} grid points ({description}) exceed the budget of {limit:,.0f}; {fix}, "
            f"or {_over(points, MAX_GRID_POINTS)}"
        )


def check_table(tables: int, rows: int, fix: str) -> None:
    """Refuse a terminal report of more than ``MAX_TABLES`` tables or ``MAX_TABLE_ROWS`` rows (scaled)."""
    factor = work_limit()
    if tables > MAX_TABLES * factor or rows > MAX_TABLE_ROWS * factor:
        size = max(tables / MAX_TABLES, rows / MAX_TABLE_ROWS)
        raise InvalidValueError(
            f"a table report of {tables:,} tables and {rows:,} rows exceeds the budget of {MAX_TABLES * factor:,.0f} "
            f"tables and {MAX_TABLE_ROWS * factor:,.0f} rows; {fix}, use --format json or csv, "
            f"or set {WORK_LIMIT_ENV}={math.ceil(size * 10) / 10:g} to draw it anyway"
        )


def check_simulation(requests: int, replications: int, runs: int, what: str = "runs") -> None:
    """Refuse more simulation work than ``MAX_SIMULATED_REQUESTS`` (scaled) requests.

    Each run also costs :data:`RUN_OVERHEAD_REQUESTS` requests' worth of setup,
    so that many tiny runs are bounded too.
    """
    total = replications * runs * (requests + RUN_OVERHEAD_REQUESTS)
    limit = MAX_SIMULATED_REQUESTS * work_limit()
    if total > limit:
        raise InvalidValueError(
            f"simulating {replications} replications x {runs:,} {what} x {requests:,} requests "
            f"(+{RUN_OVERHEAD_REQUESTS} per run for setup) = {total:,} requests exceeds the budget of {limit:,.0f} "
            f"(about a minute); lower --requests or --seeds{' or give fewer rates' if what == 'rates' else ''}, "
            f"or {_over(total, MAX_SIMULATED_REQUESTS)}"
        )


def simulation_bytes(requests: int, longest_output_tokens: float, draft_length: int, tokens_per_cycle: float,
                     batch_cap: int) -> float:
    """Estimated peak memory of one replication of the simulator, bytes.

    The fixed-k simulator draws the verification cycles of every request at
    once, ``1.3 g_max / E + 8`` cycles per request with ``k`` comparisons
    each; the adaptive (goodput) policy draws up to ``g_max`` cycles for each
    running request. Both terms are counted, so the estimate is an upper
    bound for either.
    """
    per_request = requests * _BYTES_PER_REQUEST
    if draft_length <= 0:
        return float(per_request)
    cycle = _BYTES_PER_CYCLE + draft_length
    block = 1.3 * longest_output_tokens / max(tokens_per_cycle, 1.0) + 8
    adaptive = min(requests, batch_cap) * longest_output_tokens
    return float(per_request + requests * block * cycle + adaptive * cycle)


def check_simulation_memory(requests: int, longest_output_tokens: float, draft_length: int,
                            tokens_per_cycle: float, batch_cap: int) -> None:
    """Refuse a replication whose estimated memory (:func:`simulation_bytes`) exceeds the scaled budget."""
    needed = simulation_bytes(requests, longest_output_tokens, draft_length, tokens_per_cycle, batch_cap)
    limit = MAX_SIMULATION_BYTES * work_limit()
    if needed > limit:
        raise InvalidValueError(
            f"one replication would need about {needed / 2**30:,.1f} GiB of memory ({requests:,} requests of up to "
            f"{longest_output_tokens:,.0f} output tokens at draft length {draft_length}), over the budget of "
            f"{limit / 2**30:,.1f} GiB; lower --requests or the output lengths, "
            f"or {_over(needed, MAX_SIMULATION_BYTES)}"
        )
