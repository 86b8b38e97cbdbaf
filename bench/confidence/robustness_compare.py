"""Robustness records of several models side by side: one markdown table and one plot.

Typical usage::

    python -m bench.confidence.robustness_compare bench/records/robustness-seed_cnn-h5000-png-s0.json \\
        bench/records/robustness-airbench_muon-ls0-h5000-png-s0.json --plot docs/images/robustness-models.png

Each record is what bench/confidence/robustness.py wrote for one model; the table gives each corruption's
accuracy and flagged share (means over its severities) per model, the plot the means over the
corruptions against severity.
"""

import argparse
import json
import sys

from bench.confidence.robustness import comparison, comparison_plot


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("records", nargs="+", help="bench/records/robustness-*.json, in the order of the columns")
    p.add_argument("--plot", help="write the plot here (a .png)")
    args = p.parse_args(argv)
    records = []
    for path in args.records:
        try:
            with open(path) as f:
                records.append(json.load(f))
        except (OSError, ValueError) as e:
            raise SystemExit(f"error: cannot read {path}: {e}") from None
    print(comparison(records))
    if args.plot:
        comparison_plot(records, args.plot)
        print(f"\nplot: {args.plot}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
