"""Benchmarks: ``python -m labutils.bench NAME [--quick]`` (``make bench`` runs ``all``).

Each benchmark is a module ``labutils/bench/<name>.py`` with ``run(quick) -> list[Row]``, named
by a lab in the course map (``labutils.course``); a
row is one headline figure, measured as a ratio side by side in the same run (the median of the
per-round ratios of interleaved repeats with its 95% interval, ``lu.timing.compare``; or median,
min, max of repeats), because a 2-core shared machine is too noisy for absolute times.
Speed targets live here, never in timed tests.
"""
from __future__ import annotations

import argparse
import importlib
import os
import sys
import time
from dataclasses import dataclass

from labutils import course
from labutils.core import tables
from labutils.core.env import machine
from labutils.core.timing import Comparison, Stats

# The benchmark list is the course map's: each lab names its benchmarks, each a module here.
BENCHMARKS = course.benchmarks()


def benchmark(name):
    """The ``run(quick)`` function of benchmark ``name`` (``labutils/bench/<name>.py``)."""
    return importlib.import_module(f"labutils.bench.{name}").run


@dataclass
class Row:
    benchmark: str
    figure: str
    value: Stats | Comparison | float | str
    unit: str = ""
    note: str = ""

    def cells(self):
        v = self.value
        if isinstance(v, Stats):
            value = f"{v.median:.4g} (min {v.min:.4g}, max {v.max:.4g})"
        elif isinstance(v, Comparison):
            value = f"{v.ratio:.4g} (95% CI {v.lo:.4g}-{v.hi:.4g}, n={v.n[0]})"
        elif isinstance(v, float):
            value = f"{v:.4g}"
        else:
            value = str(v)
        return [self.benchmark, self.figure, value, self.unit, self.note]

    def as_dict(self):
        v = self.value
        if isinstance(v, Stats):
            value = {"median": v.median, "min": v.min, "max": v.max, "n": v.n}
        elif isinstance(v, Comparison):
            value = {"ratio": v.ratio, "ci95": [v.lo, v.hi], "paired": v.paired, "n": list(v.n)}
        else:
            value = v
        return {"benchmark": self.benchmark, "figure": self.figure, "value": value,
                "unit": self.unit, "note": self.note}


def markdown_table(rows):
    return tables.markdown_table([r.cells() for r in rows], ["benchmark", "figure",
                                 "value (median, min, max; or ratio, 95% CI)", "unit", "note"])


# ---- the machine, the suite, the files ---------------------------------------------------


def run(names, quick=False):
    """Rows of benchmarks ``names`` (see ``run_suite``)."""
    return run_suite(names, quick)[0]


def run_suite(names, quick=False):
    """(rows, seconds per benchmark); a failing benchmark becomes a FAILED row, the others
    still run."""
    rows, seconds = [], {}
    for name in names:
        t0 = time.perf_counter()
        print(f"running {name} ...", file=sys.stderr, flush=True)
        try:
            rows += benchmark(name)(quick=quick)
        except Exception as e:  # noqa: BLE001 - one broken lab must not hide the others
            rows.append(Row(name, "FAILED", f"{type(e).__name__}: {e}"[:200]))
        seconds[name] = time.perf_counter() - t0
        print(f"  {name} took {seconds[name]:.1f} s", file=sys.stderr, flush=True)
    return rows, seconds


def write_results(rows, seconds, out_dir, quick=False):
    """Write ``bench.md``, ``bench.json`` and ``README-snippet.md`` to ``out_dir``."""
    import datetime
    import json
    os.makedirs(out_dir, exist_ok=True)
    date = datetime.datetime.now().strftime("%Y-%m-%d %H:%M")
    desc = machine()
    mode = "quick (1-2 repeats: checks it runs)" if quick else "full"
    table = markdown_table(rows)
    total = sum(seconds.values())
    with open(os.path.join(out_dir, "bench.md"), "w") as f:
        f.write(f"# Benchmarks ({mode})\n\n{date}, {desc}; {total:.0f} s in all.\n\n{table}\n")
    with open(os.path.join(out_dir, "bench.json"), "w") as f:
        json.dump({"date": date, "machine": desc, "quick": quick, "seconds": seconds,
                   "rows": [r.as_dict() for r in rows]}, f, indent=1, default=str)
    with open(os.path.join(out_dir, "README-snippet.md"), "w") as f:
        f.write(f"### Latest benchmark\n\n`make bench` on {date}: {desc}. Each figure is a "
                f"ratio measured side by side in one run (the per-round ratio with its 95% "
                f"CI, or median, min, max of interleaved repeats).\n\n{table}\n")
    return out_dir


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m labutils.bench", description=__doc__)
    parser.add_argument("names", nargs="*", default=["all"],
                        help=f"one or more of: all, {', '.join(BENCHMARKS)}")
    parser.add_argument("--quick", action="store_true", help="one repeat each (checks it runs)")
    parser.add_argument("--out", default="bench-results",
                        help="folder for bench.md, bench.json, README-snippet.md")
    args = parser.parse_args(argv)
    names = list(BENCHMARKS) if args.names in (["all"], []) else args.names
    unknown = [n for n in names if n not in BENCHMARKS]
    if unknown:
        parser.error(f"unknown benchmark(s) {unknown}; choose from all, {', '.join(BENCHMARKS)}")
    rows, seconds = run_suite(names, quick=args.quick)
    write_results(rows, seconds, args.out, quick=args.quick)
    print(f"{machine()}\n")
    print(markdown_table(rows))
    print(f"\n{sum(seconds.values()):.0f} s; written to {args.out}/ (bench.md, bench.json, "
          f"README-snippet.md)", file=sys.stderr)
    return rows


if __name__ == "__main__":
    sys.exit(1 if any(r.figure == "FAILED" for r in main()) else 0)
