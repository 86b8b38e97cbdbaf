"""A benchmark's result as a record: its figures, with the command, machine, commit and date that produced them.

A record is one JSON object in ``bench/records/NAME.json``. These keys say where its figures come from;
every other key is the figures, in the shape the script that wrote them chose (a record transcribed from
the docs holds a ``table``: ``columns``, ``rows`` and, where numbers need one, ``formats``):

* ``command``: what was run, from the repository root (several runs: their commands joined by ``; ``);
* ``machine``: ``{"kind": KIND, "cpu": the CPU's model name, "cores": N}``, ``accelerator`` where one ran
  it, ``load`` where the machine was not quiet; a kind is a key of :data:`KINDS`;
* ``commit``: the code measured (``git rev-parse --short HEAD``, ``-dirty`` when the tree had changes);
  for a figure recorded before records carried one, the commit that first recorded it;
* ``date``: the day it ran, ``YYYY-MM-DD``;
* ``source``: ``"measured"``, or ``"docs/benchmarks.md at COMMIT"`` for a figure transcribed from the
  docs as they stood at that commit.

Scripts write records with :func:`write`; ``python -m bench.report`` reads them with :func:`load_all`.
"""

import datetime
import json
import os
import shlex
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RECORDS = os.path.join(ROOT, "bench", "records")
META = ("command", "machine", "commit", "date", "source")

#: The machine kinds figures are quoted on, and what each is.
KINDS = {
    "avx2": "AVX2 and FMA only: no AVX-512, no VNNI, no bf16 (`--precision auto` picks float32)",
    "avx512": "AVX-512 without BF16",
    "avx512-bf16": "AVX-512 with BF16, no AMX tiles",
    "avx512-bf16-amx": "AVX-512 (BF16, VNNI) and AMX tiles: oneDNN runs the convolutions on AMX, mixed bfloat16 trains",
    "h200": "one NVIDIA H200 GPU (JAX, no TensorFlow)",
    "other": "none of the above",
}


def cpu_kind(flags):
    """The kind (a key of :data:`KINDS`) of a CPU with these ``/proc/cpuinfo`` flags."""
    flags = set(flags)
    if "avx512f" in flags and "avx512_bf16" in flags:
        return "avx512-bf16-amx" if "amx_bf16" in flags else "avx512-bf16"
    if "avx512f" in flags:
        return "avx512"
    return "avx2" if "avx2" in flags else "other"


def machine():
    """This machine: its kind, its CPU's model name, the cores this process may use, and the load as it starts."""
    fields = {}
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                fields.setdefault(key.strip(), value.strip())
    except OSError:
        pass
    return {"kind": cpu_kind(fields.get("flags", "").split()), "cpu": fields.get("model name"),
            "cores": len(os.sched_getaffinity(0)), "load": round(os.getloadavg()[0], 2)}


def commit():
    """``git rev-parse --short HEAD`` of the repository, ``-dirty`` when tracked files differ from it; None outside git."""
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=True)
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT, capture_output=True,
                               text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None
    return head.stdout.strip() + ("-dirty" if dirty else "")


def command(module, argv=None):
    """``python -m MODULE ARGS``: how a script run as ``module`` with ``argv`` (default: this process's) is typed."""
    module = module.removesuffix(".__main__")
    return shlex.join(["python", "-m", module, *(sys.argv[1:] if argv is None else argv)])


def check(record):
    """``record`` when it carries every key of :data:`META` with a known machine kind; ValueError naming what is wrong."""
    missing = [key for key in META if not record.get(key)]
    if missing:
        raise ValueError(f"record without {', '.join(missing)}")
    if record["machine"].get("kind") not in KINDS:
        raise ValueError(f"machine kind {record['machine'].get('kind')!r} is none of {', '.join(KINDS)}")
    datetime.date.fromisoformat(record["date"])
    return record


def write(path, figures, module, argv=None, **given):
    """``figures`` with this run's command, machine, commit and date: written to ``path``, or printed as JSON when it is None.

    ``given``: any of those keys (:data:`META`) the caller knows better, e.g. the command and commit of a
    training run that a script records after it finished, or a machine whose ``load`` is words.
    """
    unknown = set(given) - set(META)
    if unknown:
        raise TypeError(f"write() takes no {', '.join(sorted(unknown))}: figures go in figures")
    record = check({"command": command(module, argv), "machine": machine(), "commit": commit() or "unknown",
                    "date": datetime.date.today().isoformat(), "source": "measured", **given, **figures})
    text = json.dumps(record, indent=1)
    if path:
        with open(path, "w") as f:
            f.write(text + "\n")
        print(f"record: {path}")
    else:
        print(text)
    return record


def load(path):
    """The record at ``path``, checked."""
    with open(path) as f:
        record = json.load(f)
    try:
        return check(record)
    except ValueError as e:
        raise ValueError(f"{path}: {e}") from None


def load_all(folder=RECORDS):
    """``{name: record}`` of every ``NAME.json`` in ``folder``."""
    return {name[:-5]: load(os.path.join(folder, name)) for name in sorted(os.listdir(folder)) if name.endswith(".json")}
