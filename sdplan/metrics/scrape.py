"""Recording scrapes of a live ``/metrics`` endpoint into a scrape file (``sdplan scrape``).

The file is the scrapes' bodies, each preceded by a header line and followed by an end line::

    # sdplan-scrape time=1764374400.125 url=http://127.0.0.1:8000/metrics
    <the endpoint's text, as served>
    # sdplan-scrape-end

``time`` is the Unix time (s) halfway through the request. Both marker lines are comments to the
exposition format. Each scrape is appended with one ``write`` on a file opened for appending, so
concurrent readers see whole scrapes, and a crash mid-write leaves at most one scrape without its
end line, which the reader skips and counts (:mod:`sdplan.metrics.textfile`). An existing file is
appended to, never replaced: a recording stopped and restarted continues the same series.

Only loopback hosts are scraped unless the user names a host with ``--allow-host``: the command
polls a URL for as long as it runs, and it must not be pointed at hosts that are not the user's.
"""

from __future__ import annotations

import ipaddress
import math
import os
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from sdplan.errors import EngineError, InputFileError, InvalidValueError

#: The header line that opens each scrape; ``time=`` follows.
SCRAPE_MARK = "# sdplan-scrape"
#: The line that closes each scrape (a scrape without it was cut short and is skipped).
END_MARK = "# sdplan-scrape-end"
#: Largest body taken from one scrape (bytes): a vLLM server's is 20-200 KiB; anything past this is not one.
MAX_BODY_BYTES = 64 * 1024 * 1024


@dataclass(frozen=True)
class ScrapeRequest:
    """What ``sdplan scrape`` was asked: the endpoint, the interval, how long, where to append."""

    url: str
    every_s: float
    for_s: float | None
    output: Path
    timeout_s: float = 10.0
    #: Hosts besides loopback the user allows (their own servers).
    allowed_hosts: tuple[str, ...] = ()


@dataclass(frozen=True)
class ScrapeResult:
    """What a recording did."""

    output: Path
    scrapes: int
    failed: int
    bytes_written: int
    elapsed_s: float
    #: Stopped by Ctrl-C (the file holds every scrape finished before it).
    interrupted: bool
    #: Bytes the file held before (it is appended to).
    appended_to_bytes: int
    #: The last failure's reason, if any scrape failed.
    last_failure: str | None = None


def metrics_url(url: str, allowed_hosts: tuple[str, ...] = ()) -> str:
    """The ``/metrics`` URL to poll: ``http(s)://host:port[/path]`` (path ``/metrics`` when none is given).

    Raises
    ------
    InvalidValueError
        For another scheme, no host, or a host that is neither loopback nor in ``allowed_hosts``.
    """
    parsed = urllib.parse.urlsplit(url if "://" in url else "http://" + url)
    if parsed.scheme not in ("http", "https"):
        raise InvalidValueError(f"{url}: only http and https URLs are scraped")
    host = parsed.hostname
    if not host:
        raise InvalidValueError(f"{url}: no host; give e.g. http://127.0.0.1:8000/metrics")
    if not is_loopback(host) and host.lower() not in {name.lower() for name in allowed_hosts}:
        raise InvalidValueError(f"{url}: {host} is not a loopback address; scrape only servers that are yours, "
                                f"and say so with --allow-host {host}")
    path = parsed.path if parsed.path not in ("", "/") else "/metrics"
    return urllib.parse.urlunsplit((parsed.scheme, parsed.netloc, path, parsed.query, ""))


def is_loopback(host: str) -> bool:
    """Whether ``host`` is ``localhost`` or a loopback address (127.0.0.0/8, ::1)."""
    if host.lower() in ("localhost", "localhost.localdomain"):
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def fetch_metrics(url: str, timeout_s: float) -> bytes:
    """One scrape's body.

    Raises
    ------
    OSError
        When the server does not answer 200 with a body within ``timeout_s`` (the reason in the message).
    """
    request = urllib.request.Request(url, headers={"Accept": "text/plain;version=0.0.4"})
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:  # noqa: S310 - checked by metrics_url
            body: bytes = response.read(MAX_BODY_BYTES + 1)
    except urllib.error.HTTPError as error:
        error.close()  # an error answer holds its connection like a response does
        raise OSError(f"HTTP {error.code}") from None
    except (TimeoutError, urllib.error.URLError, ConnectionError) as error:
        raise OSError(str(getattr(error, "reason", error))) from None
    if len(body) > MAX_BODY_BYTES:
        raise OSError(f"body over {MAX_BODY_BYTES // 2**20} MiB: not a metrics endpoint")
    return body


def planned_scrapes(request: ScrapeRequest) -> int:
    """Scrapes a recording of ``for_s`` makes, one at its start and one per ``every_s`` after (0: until Ctrl-C)."""
    if request.for_s is None:
        return 0
    return math.floor(request.for_s / request.every_s + 1e-9) + 1  # 0.6/0.2 is 2.9999999999999996


def scrape_block(when_s: float, url: str, body: bytes) -> bytes:
    """One scrape as appended to the file: header line, body (newline-terminated), end line."""
    text = body if body.endswith(b"\n") or not body else body + b"\n"
    return f"{SCRAPE_MARK} time={when_s:.3f} url={url}\n".encode() + text + (END_MARK + "\n").encode()


def record_scrapes(request: ScrapeRequest, progress: Callable[[int, int, str], None] | None = None, *,
                   fetch: Callable[[str, float], bytes] = fetch_metrics, clock: Callable[[], float] = time.time,
                   monotonic: Callable[[], float] = time.monotonic,
                   sleep: Callable[[float], None] = time.sleep) -> ScrapeResult:
    """Poll ``request.url`` every ``every_s`` for ``for_s`` (None: until Ctrl-C), appending each scrape.

    The schedule is fixed (scrape ``i`` at ``start + i every_s``); a slow scrape skips the slots it
    overran rather than firing them late in a burst. ``progress(done, total, label)`` is called after
    each scrape (``total`` 0 without ``for_s``). Ctrl-C (:class:`KeyboardInterrupt`) ends the recording
    after the current write: the result says so and the file holds every whole scrape.

    Raises
    ------
    InvalidValueError
        For a URL that may not be scraped (:func:`metrics_url`) or a bad interval.
    EngineError
        If the first scrape fails (nothing serves metrics there).
    InputFileError
        If the output cannot be opened for appending.
    """
    url = metrics_url(request.url, request.allowed_hosts)
    if not (math.isfinite(request.every_s) and request.every_s > 0):
        raise InvalidValueError(f"--every {request.every_s:g}: give a positive interval, e.g. 15s")
    if request.for_s is not None and not (math.isfinite(request.for_s) and request.for_s > 0):
        raise InvalidValueError(f"--for {request.for_s:g}: give a positive duration, e.g. 30m")
    total = planned_scrapes(request)
    try:
        first = _timed(fetch, url, request.timeout_s, clock)
    except OSError as error:
        raise EngineError(f"{url}: no metrics ({error}); is vLLM serving there?") from None
    try:
        descriptor = os.open(request.output, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    except OSError as error:
        raise InputFileError(str(request.output), None, f"cannot append ({error.strerror}); choose another path") \
            from None
    before = os.fstat(descriptor).st_size
    start, scrapes, failed, written, failure, interrupted = monotonic(), 0, 0, 0, None, False
    body: tuple[float, bytes] | None = first
    try:
        slot = 0
        while True:
            if body is None:
                try:
                    body = _timed(fetch, url, request.timeout_s, clock)
                except OSError as error:
                    failed, failure = failed + 1, str(error)
            if body is not None:
                block = scrape_block(body[0], url, body[1])
                # one write on an O_APPEND descriptor: readers never see half a scrape from this writer
                written += os.write(descriptor, block)
                scrapes += 1
                body = None
            if progress is not None:
                progress(scrapes, total, f"{scrapes} scrapes" + (f", {failed} failed" if failed else ""))
            slot += 1
            if total and slot >= total:
                break
            wait = start + slot * request.every_s - monotonic()
            if wait < 0:  # overran: skip to the next slot ahead
                slot += int(-wait // request.every_s) + 1
                if total and slot >= total:
                    break
                wait = start + slot * request.every_s - monotonic()
            sleep(max(wait, 0.0))
    except KeyboardInterrupt:
        interrupted = True
    finally:
        os.close(descriptor)
    return ScrapeResult(output=request.output, scrapes=scrapes, failed=failed, bytes_written=written,
                        elapsed_s=monotonic() - start, interrupted=interrupted, appended_to_bytes=before,
                        last_failure=failure)


def _timed(fetch: Callable[[str, float], bytes], url: str, timeout_s: float,
           clock: Callable[[], float]) -> tuple[float, bytes]:
    """``(time halfway through the request, body)``: the counters were read somewhere in between."""
    begin = clock()
    body = fetch(url, timeout_s)
    return (begin + clock()) / 2.0, body
