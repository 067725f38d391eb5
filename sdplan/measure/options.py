"""The options of a served ``sdplan calibrate``, checked before any process starts.

:class:`ServedOptions` holds everything a served calibration needs; :func:`check_options`
refuses conflicting or impossible options before anything starts (a usage error
costs nothing); :func:`hardware_description` names the machine, for the
provenance and vLLM's default batch cap.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import os
import platform
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sdplan._vllm import INSTALL_HINT, installed_distribution
from sdplan.errors import InvalidValueError, MissingDependencyError
from sdplan.inputs.methods import check_method
from sdplan.inputs.serving import serve_flag, served_max_num_seqs
from sdplan.measure.client import LENGTH_SPREAD, read_prompt_file
from sdplan.measure.levels import SERVED_GRIDS, ServedGrid
from sdplan.measure.server import check_model_folder

#: vLLM SD methods that need a draft model folder.
METHODS_WITH_MODEL = ("draft_model", "eagle", "eagle3")
#: Options sdplan sets itself on ``vllm serve``: not accepted in --serve-arg.
_OWNED_FLAGS = ("--host", "--port", "--speculative-config", "--speculative_config")


@dataclass(frozen=True, slots=True)
class ServedOptions:
    """Everything ``sdplan calibrate`` (served) needs; validated by :func:`check_options`."""

    target: str | None
    draft: str | None
    endpoint: str | None
    method: str
    draft_lengths: tuple[int, ...]
    prompt_tokens: int
    output_tokens: int
    grid_name: str
    serve_arguments: tuple[str, ...]
    results_dir: Path
    temperature: float = 0.0
    seed: int = 0
    resume: bool = False
    server_timeout_s: float = 900.0
    #: --endpoint: the configuration's name in the results folder (default: from the server's metrics).
    label: str | None = None
    #: A JSON Lines prompt file (vLLM's custom dataset) instead of random prompts; ``output_tokens`` 0
    #: then takes every line's own ``output_tokens``.
    dataset: Path | None = None
    #: Target length of each Poisson point (None: the grid's).
    poisson_seconds: float | None = None
    #: Measurements of every point, each in its own round of fresh servers (None: the grid's).
    repeats: int | None = None
    python: str = sys.executable

    @property
    def grid(self) -> ServedGrid:
        return SERVED_GRIDS[self.grid_name]

    @property
    def rounds(self) -> int:
        """Measurements of every point, one per round: ``--repeats``, else the grid's."""
        return self.grid.repeats if self.repeats is None else self.repeats

    def serve_value(self, flag: str) -> str | None:
        """The value of a ``vllm serve`` flag among the user's arguments (:func:`sdplan.inputs.serving.serve_flag`)."""
        return serve_flag(self.serve_arguments, flag)

    def max_clients(self) -> int:
        """The most closed-loop clients the sweep may run: the server's batch cap, else the grid's largest N."""
        return self.batch_cap() or max(self.grid.concurrency)

    def batch_cap(self) -> int | None:
        """The most requests the server runs at once (vLLM ``max_num_seqs``): ``--max-num-seqs`` where the
        serving flags set it, else vLLM's default for this machine (:func:`sdplan.inputs.serving.engine_max_num_seqs`,
        128 on a CPU), lowered to ``--max-num-batched-tokens`` as vLLM lowers its default. None with
        ``--endpoint``: the server is the user's, its flags unknown."""
        value = self.serve_value("--max-num-seqs")
        if value and value.isdigit():
            return int(value)
        if self.endpoint is not None:
            return None
        return served_max_num_seqs(self.serve_arguments, hardware_description())

    def manifest_options(self) -> dict[str, Any]:
        """The options a resumed invocation must repeat exactly."""
        # The endpoint URL is left out: invocations against servers the user restarts (another port, SD on) merge.
        return {"target": self.target, "draft": self.draft, "endpoint": self.endpoint is not None,
                "method": self.method,
                "draft_lengths": list(self.draft_lengths), "prompt_tokens": self.prompt_tokens,
                "output_tokens": self.output_tokens, "grid": self.grid_name,
                "serve_arguments": list(self.serve_arguments), "temperature": self.temperature, "seed": self.seed,
                **({"dataset": str(self.dataset)} if self.dataset is not None else {}),
                **({"poisson_seconds": self.poisson_seconds} if self.poisson_seconds is not None else {}),
                **({"repeats": self.repeats} if self.repeats is not None else {})}

    def workload_text(self) -> str:
        """The requests, as the provenance states them."""
        if self.dataset is None:
            return f"random prompts {self.prompt_tokens} in / {self.output_tokens} out"
        output = "each line's output_tokens" if self.output_tokens < 1 else f"{self.output_tokens} out"
        return f"prompts from {self.dataset} (as written, no chat template), {output}"


def dataset_reader_installed() -> bool:
    """vLLM's custom-dataset reader needs pandas (its ``bench`` extra), which vLLM itself does not require."""
    return importlib.util.find_spec("pandas") is not None


def check_options(options: ServedOptions) -> None:
    """Refuse conflicting or impossible options before anything starts.

    Raises
    ------
    InvalidValueError
        (exit 2) with the option to fix.
    MissingDependencyError
        (exit 5) when vLLM is not installed in this Python.
    """
    if installed_distribution() is None:
        raise MissingDependencyError(INSTALL_HINT)
    _check_server(options)
    _check_speculation(options)
    _check_request_lengths(options)
    _check_serving_flags(options)


def _check_server(options: ServedOptions) -> None:
    """The server to measure: one sdplan starts (``--target``) or the user's (``--endpoint``), not both."""
    if options.endpoint is None and options.target is None:
        raise InvalidValueError("give --target MODEL (sdplan starts vllm serve) or --endpoint URL (a running server)")
    if options.label is not None and (options.endpoint is None or not options.label.replace("-", "").isalnum()):
        raise InvalidValueError("--label names an --endpoint configuration: letters, digits and '-' only")
    if options.endpoint is not None:
        if options.target is not None or options.serve_arguments or options.draft is not None:
            raise InvalidValueError("--endpoint measures a server you run: --target, --draft and serving flags "
                                    "belong to that server's command line, not to sdplan calibrate")
        if not options.endpoint.startswith(("http://", "https://")):
            raise InvalidValueError(f"--endpoint {options.endpoint}: give a URL, e.g. http://127.0.0.1:8000")
    if options.target is not None:
        check_model_folder(options.target)


def _check_speculation(options: ServedOptions) -> None:
    """The SD method, its draft model and draft lengths, and the flags sdplan sets on ``vllm serve`` itself."""
    check_method(options.method)
    if options.endpoint is None and options.method in METHODS_WITH_MODEL and options.draft is None \
            and options.draft_lengths:
        raise InvalidValueError(f"--spec-method {options.method} needs --draft MODEL (or --draft-lengths 0 to "
                                "measure no SD only)")
    if options.draft is not None:
        check_model_folder(options.draft)
    # vLLM (config/speculative.py, 0.32) turns draft_model/mtp into another method when the draft's path -- the
    # target's for mtp -- contains one of these words: the server would measure a method the TOML does not name
    drafted = options.draft if options.method == "draft_model" else options.target if options.method == "mtp" else None
    hijack = next((word for word in ("eagle-", "eagle3", "dflash", "dspark")
                   if drafted is not None and options.draft_lengths and word in drafted.lower()), None)
    if hijack is not None:
        raise InvalidValueError(f"{drafted}: vLLM reads a model path containing '{hijack}' as that SD method, "
                                f"whatever --spec-method {options.method} says; rename or link the folder")
    if any(k < 1 or k > 64 for k in options.draft_lengths):
        raise InvalidValueError("--draft-lengths must lie in 1..64")
    for arg in options.serve_arguments:
        if arg.split("=", 1)[0] in _OWNED_FLAGS:
            raise InvalidValueError(f"serving flag {arg}: sdplan sets it itself (a free port on 127.0.0.1; the "
                                    "speculative config from --draft/--draft-lengths/--spec-method); remove it")
def _check_request_lengths(options: ServedOptions) -> None:
    """The prompt file, and the longest calibration request against the server's ``--max-model-len``."""
    spread = 1.0 + LENGTH_SPREAD
    k_tokens = max(options.draft_lengths, default=0) + 1
    if options.dataset is not None:
        prompts = read_prompt_file(options.dataset)
        if not dataset_reader_installed():
            raise MissingDependencyError("--dataset needs pandas (vLLM's custom-dataset reader uses it): pip install "
                                         "pandas, or pip install -e '.[calibrate]'")
        if options.output_tokens < 1 and not prompts.output_lengths:
            raise InvalidValueError(f"{options.dataset}: not every line has output_tokens; give --output-tokens")
        # words are a lower bound on tokens: a request longer than this surely fails
        longest = prompts.longest_words + max(options.output_tokens, 1) + k_tokens
        what = f"the longest prompt of {options.dataset} ({prompts.longest_words} words, at least as many tokens)"
    else:
        longest = int(options.prompt_tokens * spread) + int(options.output_tokens * spread) + k_tokens
        what = (f"prompt and output up to {LENGTH_SPREAD:.0%} above {options.prompt_tokens}/"
                f"{options.output_tokens}, plus {k_tokens} draft tokens")
    max_model_len = options.serve_value("--max-model-len")
    if max_model_len is not None:
        if not max_model_len.isdigit():
            raise InvalidValueError(f"--max-model-len {max_model_len}: expected a whole number of tokens")
        if int(max_model_len) < longest:
            raise InvalidValueError(
                f"--max-model-len {max_model_len} is shorter than the longest calibration request: {what} "
                f"= {longest}; raise it or shorten the requests")


def _check_serving_flags(options: ServedOptions) -> None:
    """The batch limits among the serving flags, the IPC socket folder, and the results folder's parent."""
    seqs = options.serve_value("--max-num-seqs")
    if seqs is not None and (not seqs.isdigit() or int(seqs) < 1):
        raise InvalidValueError(f"--max-num-seqs {seqs}: expected a whole number >= 1")
    batched = options.serve_value("--max-num-batched-tokens")
    if batched is not None and batched.isdigit() and int(batched) < options.prompt_tokens and \
            "--no-enable-chunked-prefill" in options.serve_arguments:
        raise InvalidValueError(f"--max-num-batched-tokens {batched} < --prompt-tokens {options.prompt_tokens} "
                                "without chunked prefill: no request could be scheduled")
    sockets = os.environ.get("VLLM_RPC_BASE_PATH")
    if options.endpoint is None and sockets is not None and not Path(sockets).is_dir():
        raise InvalidValueError(f"VLLM_RPC_BASE_PATH={sockets}: no such folder, and vllm serve puts its IPC sockets "
                                "there; create it, or unset the variable (sdplan then gives each server a folder "
                                "of its own)")
    parent = options.results_dir.parent
    if not parent.exists():
        raise InvalidValueError(f"{parent}: no such folder for the results; create it or change --results-dir")


@functools.lru_cache(maxsize=1)
def hardware_description() -> str:
    """Accelerator (nvidia-smi) or CPU model, with the core count."""
    if shutil.which("nvidia-smi"):
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            names = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                                   text=True, timeout=10, check=False).stdout.split("\n")
            names = [n.strip() for n in names if n.strip()]
            if names:
                return f"{len(names)}x {names[0]}" if len(names) > 1 else names[0]
    name = platform.processor() or platform.machine()
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                name = line.split(":", 1)[1].strip()
                break
    return f"{name} (CPU, {os.cpu_count()} cores)"

