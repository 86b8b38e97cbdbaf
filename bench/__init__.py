"""Benchmarks, laid out by subject (bench/README.md): run from the repository root as ``python -m bench.SUBJECT.NAME``."""
