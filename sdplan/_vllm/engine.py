"""The in-process engine: real vLLM engine steps for ``sdplan calibrate --method engine``.

:class:`VllmRunner` implements :class:`sdplan.measure.engine.StepRunner` on an
in-process vLLM ``LLMEngine`` (``VLLM_ENABLE_V1_MULTIPROCESSING=0``), as
described in ``docs/engines.md#measuring-steps-in-process``:

* exactly ``B`` requests with ``p`` prompt token ids each, ``ignore_eos``,
  so that after prefill every step is a decode step over ``B`` sequences;
* verify-shaped target steps without draft cost through a zero-cost fixed-k
  proposer (``method = "custom_class"``, :class:`FixedKProposer`);
* real SD steps with ``method = "draft_model"``;
* acceptance from vLLM's ``spec_decode`` counters (``get_metrics()``).

Engines are started lazily, one configuration at a time (the previous one is
shut down first), so a grid ordered by configuration starts each once.
vLLM itself is imported only when a :class:`VllmRunner` is made.
"""

from __future__ import annotations

import gc
import importlib.metadata
import json
import os
import platform
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from sdplan._vllm import INSTALL_HINT
from sdplan.errors import EngineError, InvalidValueError, MissingDependencyError
from sdplan.measure.acceptance_counts import AcceptanceCounts

_T = TypeVar("_T")

FIXED_PROPOSER = f"{__name__}.FixedKProposer"
#: Tokens of headroom in max_model_len beyond prompt + decoded tokens.
_MARGIN_TOKENS = 16


def import_vllm() -> Any:
    """Import vLLM or explain how to install it (exit 5) or why it cannot run here (exit 6)."""
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")  # keep the progress bar readable
    try:
        import vllm
    except ImportError:
        raise MissingDependencyError(INSTALL_HINT) from None
    except Exception as error:  # a broken install: CUDA libraries missing, wrong torch build ...
        raise EngineError(f"vLLM is installed but cannot be imported on this machine: {type(error).__name__}: "
                          f"{error}") from None
    return vllm


class FixedKProposer:
    """A zero-cost proposer for ``speculative_config.method = "custom_class"``.

    It always proposes ``k`` copies of the last sampled token, so every decode
    step verifies exactly ``k + 1`` tokens per sequence while the proposer
    itself costs nothing measurable.
    """

    def __init__(self, vllm_config: Any) -> None:
        self.k = vllm_config.speculative_config.num_speculative_tokens

    def load_model(self, *args: Any, **kwargs: Any) -> None:
        """Nothing to load."""

    def propose(self, sampled_token_ids: Any, *args: Any, **kwargs: Any) -> list[list[int]]:
        return [[int(ids[-1])] * self.k if len(ids) else [] for ids in sampled_token_ids]


@dataclass(frozen=True, slots=True)
class EngineSettings:
    """How engines are built for a calibration."""

    target: str
    draft: str | None
    dtype: str = "auto"
    tensor_parallel_size: int = 1
    max_model_len: int = 2048
    max_num_seqs: int = 64
    load_format: str = "auto"
    enforce_eager: bool | None = None
    seed: int = 0
    synthetic_acceptance: float | None = None


class VllmRunner:
    """Times engine steps for :func:`sdplan.measure.engine.measure`."""

    def __init__(self, settings: EngineSettings) -> None:
        self.settings = settings
        self.vllm = import_vllm()
        self._engine: Any = None
        self._engine_key: tuple[Any, ...] | None = None
        self._warm = False  # whether the current engine has run an unrecorded decode yet
        self._random = random.Random(settings.seed)
        self._vocab = self._vocab_size()
        self.binding = self._reproduce_server_binding() if self.is_cpu else ""
        if settings.synthetic_acceptance is not None and self.is_cpu:
            raise InvalidValueError("--synthetic-acceptance needs a GPU: vLLM's synthetic rejection sampling has no "
                                    "CPU kernel ('Synthetic acceptance not supported with CPU sampling')")

    # -- platform facts ---------------------------------------------------------------------

    @staticmethod
    def _reproduce_server_binding() -> str:
        """Bind this process as ``vllm serve`` binds its CPU worker (``VLLM_CPU_OMP_THREADS_BIND=auto``).

        The server reserves one core for the API server and its IPC and runs the
        worker's OMP threads on the others; an in-process engine would otherwise
        spread over every core and time steps up to 2x faster than served.
        """
        import torch

        if os.environ.get("VLLM_CPU_OMP_THREADS_BIND", "auto") != "auto" or not hasattr(os, "sched_setaffinity"):
            return f"VLLM_CPU_OMP_THREADS_BIND={os.environ.get('VLLM_CPU_OMP_THREADS_BIND')} (left as set)"
        cpus = sorted(os.sched_getaffinity(0))
        reserved = int(os.environ.get("VLLM_CPU_NUM_OF_RESERVED_CPU", "1") or 1)
        used = cpus[:-reserved] if len(cpus) > reserved else cpus
        os.sched_setaffinity(0, used)
        torch.set_num_threads(len(used))
        return f"worker bound to cores {used}, {len(cpus) - len(used)} reserved (as vllm serve's auto binding)"

    @property
    def is_cpu(self) -> bool:
        from vllm.platforms import current_platform

        return bool(current_platform.is_cpu())

    def describe(self) -> dict[str, Any]:
        """Provenance of the measurements: hardware, engine version, settings."""
        if self.is_cpu:
            hardware = _cpu_name()
            threads = os.environ.get("VLLM_CPU_OMP_THREADS_BIND", "auto")
            hardware = f"{hardware} (CPU, {os.cpu_count()} cores, vLLM OMP binding {threads}; {self.binding})"
        else:
            import torch

            count = self.settings.tensor_parallel_size
            hardware = f"{count}x {torch.cuda.get_device_name(0)}" if count > 1 else torch.cuda.get_device_name(0)
        try:
            distribution = "vllm-cpu" if importlib.metadata.distribution("vllm-cpu") else "vllm"
        except importlib.metadata.PackageNotFoundError:
            distribution = "vllm"
        return {"hardware": hardware, "engine": "vllm", "engine_version": f"{self.vllm.__version__} ({distribution})"}

    def _vocab_size(self) -> int:
        config = Path(self.settings.target) / "config.json"
        if config.exists():
            return int(json.loads(config.read_text()).get("vocab_size", 1000))
        return 1000

    # -- engines ---------------------------------------------------------------------------

    def _speculative_config(self, kind: str, k: int) -> dict[str, Any] | None:
        if kind == "verify":
            return {"method": "custom_class", "model": FIXED_PROPOSER, "num_speculative_tokens": k}
        if kind in ("speculative", "acceptance"):
            if not self.settings.draft:
                raise InvalidValueError("this measurement needs a draft model; give --draft")
            config: dict[str, Any] = {"method": "draft_model", "model": self.settings.draft,
                                      "num_speculative_tokens": k}
            if kind == "speculative" and self.settings.synthetic_acceptance is not None:
                alpha = self.settings.synthetic_acceptance
                config["rejection_sample_method"] = "synthetic"
                config["synthetic_acceptance_rates"] = [alpha ** (i + 1) for i in range(k)]
            return config
        return None

    def _engine_for(self, kind: str, k: int, load_format: str | None = None) -> Any:
        key = (kind, k, load_format)
        if self._engine_key == key:
            return self._engine
        self.close()
        from vllm import EngineArgs
        from vllm.v1.engine.llm_engine import LLMEngine

        settings = self.settings
        eager = settings.enforce_eager if settings.enforce_eager is not None else self.is_cpu
        args = EngineArgs(
            model=settings.target,
            skip_tokenizer_init=True,
            dtype=settings.dtype,
            tensor_parallel_size=settings.tensor_parallel_size,
            max_model_len=settings.max_model_len,
            max_num_seqs=settings.max_num_seqs,
            max_num_batched_tokens=max(settings.max_model_len, 2048),
            enable_prefix_caching=False,
            enforce_eager=eager,
            load_format=load_format or settings.load_format,
            speculative_config=self._speculative_config(kind, k),
            disable_log_stats=False,
            seed=settings.seed,
        )
        try:
            self._engine = LLMEngine.from_engine_args(args)
        except (InvalidValueError, MissingDependencyError):
            raise
        except Exception as error:
            raise EngineError(f"vLLM could not start the {kind} engine (k={k}) for {settings.target}: "
                              f"{type(error).__name__}: {error}") from None
        self._engine_key = key
        self._warm = False
        return self._engine

    def close(self) -> None:
        """Shut the current engine down and free its memory."""
        if self._engine is not None:
            shutdown = getattr(self._engine, "shutdown", None) or getattr(
                getattr(self._engine, "engine_core", None), "shutdown", None)
            if callable(shutdown):
                try:
                    shutdown()
                except Exception:  # noqa: BLE001 - best effort while tearing down
                    pass
            self._engine = None
            self._engine_key = None
            gc.collect()

    # -- measurements ----------------------------------------------------------------------

    def _prompt(self, length: int) -> list[int]:
        high = max(self._vocab - 2, 3)
        return [self._random.randrange(1, high) for _ in range(length)]

    def _timed_decode(self, engine: Any, batch: int, prompt_tokens: int, steps: int,
                      tokens_per_step: int) -> list[float]:
        from vllm import SamplingParams

        budget = steps * tokens_per_step + _MARGIN_TOKENS
        if prompt_tokens + budget > self.settings.max_model_len:
            raise InvalidValueError(f"prompt {prompt_tokens} + {budget} decoded tokens exceed --max-model-len "
                                    f"{self.settings.max_model_len}; raise it")
        params = SamplingParams(temperature=0.0, max_tokens=budget, ignore_eos=True,
                                detokenize=False)
        ids = [f"t{time.monotonic_ns()}-{i}" for i in range(batch)]
        for request_id in ids:
            engine.add_request(request_id, {"prompt_token_ids": self._prompt(prompt_tokens)}, params)
        started: set[str] = set()
        while len(started) < batch and engine.has_unfinished_requests():  # prefill (possibly chunked)
            for output in engine.step():
                if output.outputs and len(output.outputs[0].token_ids) > 0:
                    started.add(output.request_id)
        times = []
        for _ in range(steps):
            begin = time.perf_counter()
            engine.step()
            times.append(time.perf_counter() - begin)
        engine.abort_request(ids)
        while engine.has_unfinished_requests():
            engine.step()
        return times

    def _decode(self, kind: str, batch: int, draft_length: int, prompt_tokens: int, steps: int) -> list[float]:
        """Time ``steps`` decode steps on the engine of ``kind``, warming a fresh engine first.

        A fresh engine's first decode run is slow throughout, not only in its
        first step: on vllm-cpu 0.32 the first task of each engine took a median
        step of 10.8-11.9 ms where the next took 7.2 ms, which made batch 1 look
        dearer than batch 4. So each new engine runs one unrecorded decode of
        the same shape before its first timed one.
        """
        engine = self._engine_for(kind, draft_length)

        def decode() -> list[float]:
            return self._timed_decode(engine, batch, prompt_tokens, steps, draft_length + 1)

        if not self._warm:
            self._guard(decode)
            self._warm = True
        return self._guard(decode)

    def target_steps(self, batch: int, draft_length: int, prompt_tokens: int, steps: int) -> list[float]:
        return self._decode("verify" if draft_length > 0 else "target", batch, draft_length, prompt_tokens, steps)

    def speculative_steps(self, batch: int, draft_length: int, prompt_tokens: int, steps: int) -> list[float]:
        return self._decode("speculative", batch, draft_length, prompt_tokens, steps)

    def prefill_seconds(self, prompt_tokens: int) -> float:
        from vllm import SamplingParams

        engine = self._engine_for("target", 0)

        def run() -> float:
            params = SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True, detokenize=False)
            engine.add_request(f"p{time.monotonic_ns()}", {"prompt_token_ids": self._prompt(prompt_tokens)}, params)
            begin = time.perf_counter()
            while engine.has_unfinished_requests():
                engine.step()
            return time.perf_counter() - begin

        return self._guard(run)

    def acceptance(self, prompts: list[list[int]], draft_length: int, output_tokens: int,
                   temperature: float = 0.0) -> AcceptanceCounts:
        """Run the real SD configuration on ``prompts`` and difference vLLM's counters."""
        from vllm import SamplingParams

        load_format = "auto" if self.settings.load_format == "dummy" else None
        engine = self._engine_for("acceptance", draft_length, load_format)

        def run() -> AcceptanceCounts:
            before = _spec_counters(engine.get_metrics())
            # ignore_eos alone forces the full length; min_tokens would also mask EOS in the target's sampling
            params = SamplingParams(temperature=temperature, max_tokens=output_tokens,
                                    ignore_eos=True, detokenize=False, seed=self.settings.seed)
            for index, prompt in enumerate(prompts):
                engine.add_request(f"a{time.monotonic_ns()}-{index}", {"prompt_token_ids": prompt}, params)
            while engine.has_unfinished_requests():
                engine.step()
            after = _spec_counters(engine.get_metrics())
            per_position = tuple(a - b for a, b in zip(after["per_position"], before["per_position"]))
            return AcceptanceCounts(
                num_drafts=after["drafts"] - before["drafts"],
                num_draft_tokens=after["draft_tokens"] - before["draft_tokens"],
                num_accepted_tokens=after["accepted"] - before["accepted"],
                accepted_per_position=per_position + (0,) * (draft_length - len(per_position)),
            )

        return self._guard(run)

    def _guard(self, action: Callable[[], _T]) -> _T:
        try:
            return action()
        except (InvalidValueError, KeyboardInterrupt):
            raise
        except Exception as error:
            raise EngineError(f"vLLM failed during a measurement: {type(error).__name__}: {error}") from None


def _spec_counters(metrics: list[Any]) -> dict[str, Any]:
    """vLLM's speculative-decoding counters from a ``get_metrics()`` snapshot (0 when absent)."""
    found: dict[str, Any] = {"drafts": 0, "draft_tokens": 0, "accepted": 0, "per_position": ()}
    for metric in metrics:
        name = metric.name.removesuffix("_total")
        if name == "vllm:spec_decode_num_drafts":
            found["drafts"] = int(metric.value)
        elif name == "vllm:spec_decode_num_draft_tokens":
            found["draft_tokens"] = int(metric.value)
        elif name == "vllm:spec_decode_num_accepted_tokens":
            found["accepted"] = int(metric.value)
        elif name == "vllm:spec_decode_num_accepted_tokens_per_pos":
            found["per_position"] = tuple(int(v) for v in metric.values)
    return found


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as stream:
            for line in stream:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()
