"""What every stage's CLI shares: value types (``argparse`` ``type=``), each refusing with a line that says why,
and renamed options that keep their old spelling for one release (:func:`add_renamed`)."""

import argparse
import sys


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


class _Renamed(argparse.Action):
    """The old spelling of a renamed option: stores into the new option's ``dest`` and says, once, to use the new one."""

    def __init__(self, option_strings, dest, new=None, **kwargs):
        super().__init__(option_strings, dest, **kwargs)
        self.new = new
        self.noted = False

    def __call__(self, parser, namespace, values, option_string=None):
        if not self.noted:
            self.noted = True
            print(f"{parser.prog}: note: {option_string} is deprecated and goes in the next release; use {self.new}",
                  file=sys.stderr)
        setattr(namespace, self.dest, values)


def add_renamed(parser, new, old, **kwargs):
    """Add option ``new`` (``kwargs`` as ``add_argument`` takes them) and its former spelling ``old``.

    ``old`` still works for one release: it sets the same value, prints a one-line deprecation note
    on stderr the first time it is used, and is left out of ``--help``.
    """
    action = parser.add_argument(new, **kwargs)
    parser.add_argument(old, dest=action.dest, action=_Renamed, new=new, default=argparse.SUPPRESS,
                        help=argparse.SUPPRESS, type=kwargs.get("type"), choices=kwargs.get("choices"),
                        metavar=action.metavar)
    return action
