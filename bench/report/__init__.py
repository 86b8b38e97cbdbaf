"""docs/benchmarks.md's tables, rendered from the records in bench/records/ (:mod:`bench.report.core`).

The regions are rendered by the modules of their subject, which register them on import.
"""

from bench.report import accuracy, confidence, robustness, scores, serving, training  # noqa: F401 (they register their regions)
from bench.report.core import DOC, HEADING, REGION, main, render, slug  # noqa: F401
