"""The test suite, a package so that its modules import their helpers as ``tests.<module>``.

pytest (its default ``prepend`` import mode) puts the folder above this one, the repository's root, on
``sys.path`` when it imports the tests, so ``from tests.results_fixtures import write_csv`` works without
any path set by hand. The helpers are plain modules here: ``results_fixtures`` (benchmark result files from
the model), ``served_fakes`` (a step-level fake of a served engine and its client) and ``fuzz_cli`` (the
bad-input strategies and property; ``python -m tests.fuzz_cli`` runs them at length). Code shared with the
benchmarks lives in the package, :mod:`sdplan.testing`.
"""
