"""Command-line value types every stage's CLI shares (``argparse`` ``type=``), each refusing with a line that says why."""

import argparse


def int_at_least(minimum):
    """An ``argparse`` type: a whole number no smaller than ``minimum``."""

    def parse(text):
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be at least {minimum}, got {value}")
        return value

    return parse


def positive_float(text):
    """An ``argparse`` type: a number above zero."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be positive, got {text}")
    return value


positive_int = int_at_least(1)
non_negative_int = int_at_least(0)
