"""What the tests and the benchmarks share: nothing here is imported by the ``sdplan`` command.

* :mod:`~sdplan.testing.tiny_models`: tiny Llama models with exactly known acceptance, built on the spot (no
  downloads), for the real-engine tests (``pytest -m vllm``) and ``benchmarks/accuracy_served.py``. They need
  torch and transformers (installed with vLLM), imported only when a model is built.
"""
