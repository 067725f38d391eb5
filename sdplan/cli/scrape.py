"""``sdplan scrape``: record a live vLLM server's ``/metrics`` into a scrape file for ``fit``/``validate``."""

from __future__ import annotations

import math
import re
from pathlib import Path

import click

from sdplan.cli._options import complete_file

#: Duration units ``--every``/``--for`` take.
UNITS_S = {"ms": 0.001, "s": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0, "d": 86400.0}


def parse_duration(ctx: click.Context, param: click.Parameter, value: str | None) -> float | None:
    """``15s``, ``30m``, ``2h``, ``500ms`` or plain seconds -> seconds."""
    if value is None:
        return None

    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)\s*(ms|s|min|m|h|d)?\s*", value)
    if not match:
        raise click.BadParameter(f"{value!r}: give a duration such as 15s, 30m or 2h")
    seconds = float(match.group(1)) * UNITS_S[match.group(2) or "s"]
    if not math.isfinite(seconds) or seconds <= 0:
        raise click.BadParameter(f"{value!r}: must be a positive duration")
    return seconds


@click.command()
@click.argument("url", metavar="URL")
@click.option("--every", "every_s", default="15s", show_default=True, callback=parse_duration, metavar="DURATION",
              help="Interval between scrapes (15s, 1m, 500ms).")
@click.option("--for", "for_s", callback=parse_duration, metavar="DURATION",
              help="Stop after this long (30m, 24h). Default: until Ctrl-C.")
@click.option("-o", "--output", required=True, metavar="FILE", shell_complete=complete_file,
              help="Scrape file to append to (created if missing; never replaced).")
@click.option("--timeout", "timeout_s", default="10s", show_default=True, callback=parse_duration, metavar="DURATION",
              help="Give up on one scrape after this long (counted as failed, the recording goes on).")
@click.option("--allow-host", "allowed_hosts", multiple=True, metavar="HOST",
              help="A host of yours besides loopback that may be scraped. Repeatable.")
def scrape(url: str, every_s: float, for_s: float | None, output: str, timeout_s: float,
           allowed_hosts: tuple[str, ...]) -> None:
    """Record a vLLM server's Prometheus metrics for sdplan fit and validate.

    Polls URL (http://HOST:PORT, /metrics implied) every --every and appends
    each scrape, with its time, to FILE: scrapes separated by a line
    '# sdplan-scrape time=<unix seconds> url=<url>' and closed by
    '# sdplan-scrape-end'. One write per scrape on a file opened for
    appending, so a file read while it is written holds whole scrapes, and a
    recording restarted continues it. Ctrl-C, SIGTERM (kill, timeout,
    systemd) or a closed terminal stop it cleanly (exit 0); the progress bar
    shows on a terminal only. Loopback hosts only, unless
    --allow-host names yours.

    \b
    Examples:
      sdplan scrape http://127.0.0.1:8000 --every 15s --for 30m -o prod.scrapes
      sdplan scrape http://gpu7.lab:8000 --allow-host gpu7.lab -o gpu7.scrapes
      sdplan fit prod.scrapes -o mybox.toml
    """

    from sdplan.metrics.scrape import ScrapeRequest, planned_scrapes, record_scrapes
    from sdplan.render import say
    from sdplan.render.progress import progress_bar
    from sdplan.stopping import stop_signals

    assert every_s is not None and timeout_s is not None
    request = ScrapeRequest(url=url, every_s=every_s, for_s=for_s, output=Path(output), timeout_s=timeout_s,
                            allowed_hosts=allowed_hosts)
    total = planned_scrapes(request)
    with stop_signals() as received, progress_bar("scraping", total) as advance:
        result = record_scrapes(request, lambda done, of, label: advance(done, of or done + 1, label))
    by = "Ctrl-C" if received[:1] in ([], ["SIGINT"]) else received[0]
    stopped = f"stopped by {by}: " if result.interrupted else ""
    appended = f" (appended to {result.appended_to_bytes} bytes already there)" if result.appended_to_bytes else ""
    failed = (f"; {result.failed} scrapes failed, the last: {result.last_failure}" if result.failed else "")
    say(f"{stopped}{result.scrapes} scrapes in {result.elapsed_s:.0f} s, {result.bytes_written} bytes written to "
        f"{result.output}{appended}{failed}")
