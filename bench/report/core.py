"""docs/benchmarks.md's tables, rendered from the records in bench/records/.

Typical usage::

    python -m bench.report            # rewrite the rendered regions of docs/benchmarks.md
    python -m bench.report --check    # change nothing; exit 1, naming the regions that differ from the records

docs/benchmarks.md is written by hand but for its regions marked::

    <!-- bench.report: NAME [NAME ...] -->
    ...
    <!-- /bench.report -->

A NAME registered by a module of bench/report/ (``@region("NAME")``) is rendered by its function from the records it reads; otherwise
the NAMEs are records that hold a ``table`` (one table where their columns agree, with each row's machine
kind and record). Under each region: a numbered line per record read, with its machine kind, commit, date
and command. A record's ``targets`` (``{"target", "measured", "at_least" or "at_most", "format"}``) and
those a function declares are gathered into the region ``targets``, each with the section it is in.
"""

import argparse
import fnmatch
import os
import re
import sys

from bench import record as records

DOC = os.path.join(records.ROOT, "docs", "benchmarks.md")
REGION = re.compile(r"(<!-- bench\.report: ([^>]+?) -->\n)(.*?)(<!-- /bench\.report -->)", re.S)
HEADING = re.compile(r"^#{1,6} (.+)$", re.M)
KIND_NAMES = {"avx2": "AVX2", "avx512": "AVX-512", "avx512-bf16": "AVX-512 BF16", "avx512-bf16-amx": "AVX-512 BF16 + AMX",
              "h200": "H200", "other": "other"}
REGIONS = {}


def region(name):
    """Register a function ``(report) -> markdown`` as the renderer of the region ``name``."""
    def register(fn):
        REGIONS[name] = fn
        return fn
    return register


class Report:
    """The records, which of them a region read, and the targets gathered on the way."""

    def __init__(self, all_records):
        self.records = all_records
        self.used = set()
        self.targets = []
        self.section = None
        self.read = []  # the records the region being rendered read, in order

    def __getitem__(self, name):
        if name not in self.records:
            raise KeyError(f"no record bench/records/{name}.json")
        if name not in self.read:
            self.read.append(name)
        self.used.add(name)
        return self.records[name]

    def matching(self, pattern):
        """``[(name, record)]`` of every record whose name matches the glob ``pattern``, by name."""
        names = sorted(fnmatch.filter(self.records, pattern))
        if not names:
            raise KeyError(f"no record matches bench/records/{pattern}.json")
        return [(name, self[name]) for name in names]

    def target(self, text, measured, wanted, fmt, names, at_least=True):
        """A target met when ``measured`` is at least (or, ``at_least=False``, at most) ``wanted``."""
        met = measured >= wanted if at_least else measured <= wanted
        kinds = list(dict.fromkeys(kind(self.records[n]) for n in names))
        self.targets.append({"target": text, "measured": fmt.format(measured),
                             "wanted": ("≥ " if at_least else "≤ ") + fmt.format(wanted),
                             "met": met, "kind": ", ".join(kinds), "section": self.section})


# -- formatting --------------------------------------------------------------------------------
def kind(rec):
    return KIND_NAMES[rec["machine"]["kind"]]


def pct(x, digits=2):
    return f"{x * 100:.{digits}f}%"


def with_interval(x, low, high, digits=2):
    return f"{x * 100:.{digits}f}% ({low * 100:.{digits}f}-{high * 100:.{digits}f}%)"


def table(columns, rows):
    """A markdown table; a column is right-aligned when every cell in it starts with a digit, a sign or a bracket."""
    def numeric(i):
        cells = [str(r[i]) for r in rows if str(r[i])]
        return bool(cells) and all(re.match(r"[-+−\d(≥≤~]", c) for c in cells)
    lines = ["| " + " | ".join(columns) + " |", "|" + "|".join("---:" if numeric(i) else "---" for i in range(len(columns))) + "|"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def cell(value, fmt):
    if value is None:
        return ""
    if isinstance(value, str) or fmt is None:
        return str(value)
    return fmt.format(value)


def provenance(report):
    """A numbered line per record the region read: the file, machine kind and CPU, commit, date and command."""
    lines = []
    for name in report.read:
        rec = report.records[name]
        machine = rec["machine"]
        where = ", ".join(str(x) for x in (kind(rec), machine.get("cpu"), machine.get("accelerator"),
                                           f"{machine['cores']} cores" if machine.get("cores") else None,
                                           machine.get("load") if isinstance(machine.get("load"), str) else None) if x)
        lines.append(f"{len(lines) + 1}. [`{name}`](../bench/records/{name}.json): {where}; code of `{rec['commit']}`, "
                     f"{rec['date']}: `{rec['command']}`")
    return "\n".join(lines)


def tables_of(rec):
    return rec["table"] if isinstance(rec["table"], list) else [rec["table"]]


def rendered_rows(spec):
    formats = spec.get("formats") or [None] * len(spec["columns"])
    return [[cell(v, f) for v, f in zip(row, formats)] for row in spec["rows"]]


def declare_targets(report, name):
    for t in report[name].get("targets", []):
        at_least = "at_least" in t
        report.target(t["target"], t["measured"], t["at_least"] if at_least else t["at_most"], t.get("format", "{}"),
                      [name], at_least)


def generic(report, name):
    """The tables a record holds (``table``: ``columns``, ``rows``, ``formats``; or a list of them), and its ``targets``."""
    declare_targets(report, name)
    return "\n\n".join(table(spec["columns"], rendered_rows(spec)) for spec in tables_of(report[name]))


def generic_region(*names):
    """A region of the tables held by ``names``: one table, with each row's machine kind and record, where their columns agree."""
    def render(report):
        specs = [tables_of(report[n]) for n in names]
        if len(names) == 1 or any(len(s) != 1 or s[0]["columns"] != specs[0][0]["columns"] for s in specs):
            return "\n\n".join(generic(report, n) for n in names)
        rows = []
        for number, name in enumerate(names, 1):
            declare_targets(report, name)
            rows += [[*row, kind(report[name]), number] for row in rendered_rows(specs[number - 1][0])]
        return table([*specs[0][0]["columns"], "machine kind", "record"], rows)
    return render


# -- the targets ---------------------------------------------------------------------------------
def slug(heading):
    """GitHub's anchor of a heading."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower().replace("`", ""))
    return text.replace(" ", "-")


def glance(report):
    rows = [[t["target"], t["measured"], t["wanted"], "met" if t["met"] else "**missed**", t["kind"],
             f"[{t['section'][0]}](#{t['section'][1]})"] for t in report.targets]
    return table(["target", "measured", "wanted", "", "machine kind", "section"], rows)


# -- the document --------------------------------------------------------------------------------
def render(text, all_records):
    """``text`` with every region rendered from ``all_records``; ``(text, report)``."""
    report = Report(all_records)
    pieces, position, targets_at = [], 0, None
    for match in REGION.finditer(text):
        start, name = match.start(), match.group(2)
        headings = HEADING.findall(text, 0, start)
        report.section = (headings[-1].replace("`", ""), slug(headings[-1])) if headings else ("top", "")
        pieces.append(text[position:match.start(3)])
        if name == "targets":
            targets_at = len(pieces)
            pieces.append(None)
        else:
            report.read = []
            body = (REGIONS.get(name) or generic_region(*name.split()))(report)
            pieces.append(body + ("\n\n" + provenance(report) if report.read else "") + "\n")
        position = match.end(3)
    pieces.append(text[position:])
    if targets_at is not None:
        pieces[targets_at] = glance(report) + "\n"
    return "".join(pieces), report


def kinds_table(all_records):
    """The machine kinds the records name: what each is, and the CPUs seen of it."""
    seen = {}
    for rec in all_records.values():
        seen.setdefault(rec["machine"]["kind"], set()).add(rec["machine"].get("cpu") or rec["machine"].get("accelerator"))
    rows = [[KIND_NAMES[k], records.KINDS[k], ", ".join(sorted(c for c in seen[k] if c))] for k in records.KINDS if k in seen]
    return table(["kind", "what it is", "seen as"], rows)


@region("kinds")
def kinds(report):
    out = kinds_table(report.records)
    report.read = []
    return out


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--check", action="store_true", help="change nothing; exit 1 when docs/benchmarks.md differs from the render")
    args = p.parse_args(argv)
    with open(DOC) as f:
        text = f.read()
    rendered, report = render(text, records.load_all())
    unused = sorted(set(report.records) - report.used)
    if unused:
        print(f"records no region reads: {', '.join(unused)}", file=sys.stderr)
    if args.check:
        differ = [m.group(2) for m, n in zip(REGION.finditer(text), REGION.finditer(rendered)) if m.group(3) != n.group(3)]
        if differ:
            print(f"docs/benchmarks.md differs from the records in: {', '.join(differ)} (python -m bench.report)", file=sys.stderr)
            return 1
        return 0
    with open(DOC, "w") as f:
        f.write(rendered)
    return 0

