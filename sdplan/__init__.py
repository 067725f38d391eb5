"""sdplan: a capacity planner for speculative decoding in LLM serving.

Importing this package is cheap on purpose: it pulls in nothing beyond the
standard library, so ``sdplan --help`` stays fast.
"""

__version__ = "0.1.0"
