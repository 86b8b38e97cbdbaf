"""``vmstat`` beside a training benchmark, so that its time can be judged: the runnable processes and the CPU
shares over a span, and the words a record's ``machine.load`` takes from them.

``r`` is the processes runnable; above the cores, other work was competing for them (which ``us`` cannot
show). ``us``, ``sy``, ``id`` and ``st`` are the shares of the CPU: user, system, idle, stolen by the host.
"""

import datetime
import statistics
import subprocess
import threading
import time

FIELDS = ("r", "us", "sy", "id", "st")


def summary(rows, every):
    """``{"samples", "every_s", FIELD: {"median", "mean", "max"}}`` of ``rows`` (``{field: value}``); None for none."""
    if not rows:
        return None
    out = {"samples": len(rows), "every_s": every}
    for name in FIELDS:
        values = [row[name] for row in rows]
        out[name] = {"median": statistics.median(values), "mean": round(statistics.mean(values), 1), "max": max(values)}
    return out


def load(words, shares):
    """A record's ``machine.load``: ``words`` for how shared the machine was, with ``r``'s median over the run."""
    return f"{words} (vmstat r median {shares['r']['median']:g})" if shares else words


class Vmstat:
    """``vmstat -n EVERY`` in the background, each line kept with the monotonic time it came."""

    def __init__(self, every=5):
        self.every = every
        self.rows = []  # (monotonic time, {field: value})
        self.process = subprocess.Popen(["vmstat", "-n", str(every)], stdout=subprocess.PIPE, text=True)
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self):
        header, since_boot = None, True
        for line in self.process.stdout:
            parts = line.split()
            if "us" in parts and "st" in parts:
                header = parts
            elif header and len(parts) == len(header) and parts[0].isdigit():
                if not since_boot:  # the first line is the averages since boot
                    self.rows.append((time.monotonic(), dict(zip(header, map(int, parts)))))
                since_boot = False

    def stop(self):
        self.process.terminate()
        self.process.wait()
        self.thread.join(timeout=5)

    def summary(self, start, end):
        """:func:`summary` of the lines that came between the monotonic times ``start`` and ``end``."""
        return summary([row for at, row in self.rows if start < at <= end], self.every)


def logged(path, start, end, every=5):
    """:func:`summary` of the lines of a ``vmstat -t`` log stamped between ``start`` and ``end`` (UTC datetimes;
    ``vmstat -t`` stamps in UTC when TZ is UTC)."""
    header, rows = None, []
    with open(path) as f:
        for line in f:
            parts = line.split()
            if "us" in parts and "st" in parts:
                header = [part for part in parts if part != "UTC"]  # -t's stamp column
                continue
            if not header or len(parts) < len(header) + 2 or not parts[0].isdigit():
                continue
            stamp = datetime.datetime.fromisoformat(" ".join(parts[-2:])).replace(tzinfo=datetime.timezone.utc)
            if start <= stamp <= end:
                rows.append(dict(zip(header, map(int, parts[:len(header)]))))
    return summary(rows, every)
