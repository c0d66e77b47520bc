"""``meshbatch bench``: the kernel families and the pipeline step measured, a JSON and a table.

meshbatch bench --all --out /tmp/bench                   # realistic default shapes
meshbatch bench causal_build era_shuffle --rows 256 --seq-len 4096 --out /tmp/bench
meshbatch bench --all --tiny --repeats 20 --out /tmp/bench   # seconds, for CI
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import tempfile


def add_bench(sub: argparse._SubParsersAction) -> None:
    from .kernel_cases import Shapes
    from .report import ALL

    defaults = Shapes()
    p = sub.add_parser("bench", help="measure the jitted kernels and the pipeline step (JSON + table)")
    p.add_argument("names", nargs="*", help=f"benchmarks to run: {', '.join(ALL)}")
    p.add_argument("--all", action="store_true", help="every kernel family and the pipeline step")
    p.add_argument(
        "--out",
        default=os.path.join(tempfile.gettempdir(), "meshbatch-bench"),
        help="directory for the JSON (never inside the checkout; default: %(default)s)",
    )
    p.add_argument("--tiny", action="store_true", help="tiny shapes (seconds; what the tests run)")
    p.add_argument("--repeats", type=int, default=20, help="timed calls per benchmark (>= 20)")
    p.add_argument("--dispatch-calls", type=int, default=100, help="calls of the dispatch-throughput mode")
    p.add_argument("--baseline", help="a meshbatch bench JSON: exit 1 on a slower median or a new recompile")
    p.add_argument("--tolerance", type=float, default=0.25, help="with --baseline: slowdown allowed (0.25)")
    for field in dataclasses.fields(Shapes):
        flag = "--" + field.name.replace("_", "-")
        p.add_argument(flag, type=int, default=None, help=f"default {getattr(defaults, field.name)}")
    p.set_defaults(run=_bench)


def _bench(args: argparse.Namespace) -> int:
    from .kernel_cases import TINY, Shapes
    from .report import ALL, format_table, run_bench, write_report

    if args.all and args.names:
        raise ValueError(f"give --all or benchmark names, not both (got {args.names})")
    if not args.all and not args.names:
        raise ValueError(f"give --all or benchmark names: {', '.join(ALL)}")
    base = TINY if args.tiny else Shapes()
    given = {
        f.name: getattr(args, f.name) for f in dataclasses.fields(Shapes) if getattr(args, f.name) is not None
    }
    shapes = dataclasses.replace(base, **given)
    names = list(ALL) if args.all else args.names
    report = run_bench(names, shapes, repeats=args.repeats, dispatch_calls=args.dispatch_calls)
    path = write_report(report, args.out)
    print(format_table(report))
    print(f"wrote {path}")
    if args.baseline:
        from .gates import assert_no_regression

        with open(args.baseline) as f:
            baseline = json.load(f)
        try:
            assert_no_regression(report["results"], baseline, tolerance=args.tolerance)
        except AssertionError as failed:
            print(f"meshbatch bench: regression against {args.baseline}: {failed}", file=sys.stderr)
            return 1
        print(f"no regression against {args.baseline} (tolerance {args.tolerance:.0%})")
    return 0
