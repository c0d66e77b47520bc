"""The ``meshbatch`` command: a small dispatcher; each subcommand registers its parser and handler.

meshbatch validate-cache /data/cache          # prints a report; exit 0 valid, 1 invalid
meshbatch validate-cache /data/cache --deep   # also reads every chunk and verifies its checksum
meshbatch build-cache /data/cache a.jsonl b.txt --tokenizer tokenizer.json
meshbatch bench --all --out /tmp/bench               # kernel and pipeline-step microbenchmarks
meshbatch bench causal_build era_shuffle --rows 256 --seq-len 4096 --out /tmp/bench
meshbatch bench --all --tiny --repeats 20 --out /tmp/bench   # seconds, for CI
meshbatch provenance my_project.data:make_pipeline --step 1200   # where step 1200's rows came from
meshbatch provenance my_project.data:make_pipeline --step 1200 --state ckpt/data_state.json
meshbatch provenance my_project.data:make_pipeline --fingerprint

A failure prints one line, ``meshbatch <command>: error: <what went wrong>``, and exits 1; ``-v``
shows the traceback instead. Ctrl-C prints one line saying how to go on (``build-cache``: run the
same command again to resume) and exits 130.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import json
import logging
import os
import sys
import tempfile
from collections.abc import Sequence

from .datasets.preblocked.block_cli import add_convert_pt, add_preblock, add_validate_blocks


def _add_validate_cache(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("validate-cache", help="check a token cache and print a report (exit 1 if invalid)")
    p.add_argument("path", help="cache root (the directory holding shard_ledger.json)")
    p.add_argument("--field", default="input_ids", help="jagged field to check (default: input_ids)")
    p.add_argument("--allow-unfinished", action="store_true", help="accept a cache still being written")
    p.add_argument(
        "--deep", action="store_true", help="read every chunk: check it decodes and matches its checksum"
    )
    p.add_argument("--no-progress", action="store_true", help="no progress bar with --deep")
    p.set_defaults(run=_validate_cache)


def _validate_cache(args: argparse.Namespace) -> int:
    from .cache import validate_cache

    report = validate_cache(
        args.path,
        args.field,
        require_finished=not args.allow_unfinished,
        deep=args.deep,
        progress=False if args.no_progress else None,
    )
    print(report.format())
    return 0 if report.ok else 1


def _add_build_cache(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("build-cache", help="tokenize text / JSONL files into a Levanter-format token cache")
    p.add_argument("output", help="cache root to write")
    p.add_argument("inputs", nargs="+", help=".txt / .jsonl files (optionally .gz), in order")
    p.add_argument("--tokenizer", help="local tokenizer.json (Hugging Face tokenizers); default: UTF-8 bytes")
    p.add_argument("--eos-token", help="with --tokenizer: token appended to every document")
    p.add_argument("--field", default="input_ids")
    p.add_argument(
        "--dtype", default="int32", type=_integer_dtype, help="integer token dtype on disk (default: int32)"
    )
    p.add_argument("--text-key", default="text", help="JSONL field holding the text (default: text)")
    p.add_argument(
        "--text-docs", choices=["file", "line"], default="file", help="a .txt file is one doc or one per line"
    )
    p.add_argument("--if-exists", choices=["resume", "error", "overwrite"], default="resume")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(run=_build_cache)


def _integer_dtype(value: str) -> str:
    """argparse ``type=`` for ``--dtype``: an integer numpy dtype name, else a usage error naming it."""
    import numpy as np

    try:
        dtype = np.dtype(value)
    except TypeError:
        raise argparse.ArgumentTypeError(
            f"{value!r} is not a numpy dtype (use e.g. int32 or uint16)"
        ) from None
    if not np.issubdtype(dtype, np.integer):
        raise argparse.ArgumentTypeError(f"{value!r} is not an integer dtype (use e.g. int32 or uint16)")
    return dtype.name


def _build_cache(args: argparse.Namespace) -> int:
    from .cache import ByteTokenizer, HFTokenizer, build_cache

    if args.eos_token and not args.tokenizer:
        raise ValueError("--eos-token needs --tokenizer (the byte tokenizer always ends documents with 256)")
    tokenizer = HFTokenizer(args.tokenizer, eos_token=args.eos_token) if args.tokenizer else ByteTokenizer()
    ledger = build_cache(
        args.output,
        args.inputs,
        tokenizer=tokenizer,
        field=args.field,
        dtype=args.dtype,
        text_key=args.text_key,
        text_docs=args.text_docs,
        if_exists=args.if_exists,
        progress=False if args.no_progress else None,
    )
    print(
        f"built {args.output}: {ledger.total_num_rows} rows, {ledger.field_counts.get(args.field, 0)} tokens"
    )
    return 0


def _add_bench(sub: argparse._SubParsersAction) -> None:
    from .bench.kernel_cases import Shapes
    from .bench.report import ALL

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
    from .bench.kernel_cases import TINY, Shapes
    from .bench.report import ALL, format_table, run_bench, write_report

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
        from .bench.gates import assert_no_regression

        try:
            assert_no_regression(report["results"], args.baseline, tolerance=args.tolerance)
        except AssertionError as failed:
            print(f"meshbatch bench: regression against {args.baseline}: {failed}", file=sys.stderr)
            return 1
        print(f"no regression against {args.baseline} (tolerance {args.tolerance:.0%})")
    return 0


def _add_provenance(sub: argparse._SubParsersAction) -> None:
    """``meshbatch provenance``: which rows, documents and token ranges made step N, as JSON lines.

    ``factory`` (``module:function``) names a function of no arguments that returns the run's
    ``Pipeline`` (the same dataset, key and batch sizes as training); nothing is read but the
    plan's tables, so it answers at once at any step. One JSON object per row
    (``Provenance.records``), or the content fingerprint."""
    p = sub.add_parser("provenance", help="the source, document and token range of every row of a step")
    p.add_argument("factory", help="module:function returning the run's Pipeline")
    p.add_argument("--step", type=int, action="append", default=[], help="a step (repeat for several)")
    p.add_argument("--state", help="a state_dict() JSON saved before the step (token-balanced mixtures)")
    p.add_argument("--fingerprint", action="store_true", help="print the dataset's content fingerprint")
    p.set_defaults(run=_provenance)


def _provenance(args: argparse.Namespace) -> int:
    from .pipeline import Pipeline

    if not args.step and not args.fingerprint:
        raise ValueError("give --step N (one or more) or --fingerprint")
    module, _, name = args.factory.partition(":")
    if not module or not name:
        raise ValueError(
            f"factory={args.factory!r} must be module:function (e.g. my_project.data:make_pipeline)"
        )
    factory = getattr(importlib.import_module(module), name, None)
    if not callable(factory):
        raise ValueError(f"{args.factory!r} names no function in {module} (got {factory!r})")
    pipeline = factory()
    if not isinstance(pipeline, Pipeline):
        raise TypeError(f"{args.factory} returned {type(pipeline).__name__}, not a meshbatch Pipeline")
    state = None
    if args.state:
        with open(args.state) as f:
            state = json.load(f)
    if args.fingerprint:
        print(json.dumps({"content_fingerprint": pipeline.content_fingerprint()}))
    for step in args.step:
        for record in pipeline.provenance(step, state=state).records():
            sys.stdout.write(json.dumps(record) + "\n")
    return 0


_AFTER_INTERRUPT = {
    "build-cache": "the rows committed so far are kept: run the same command again to resume",
    "preblock": "the output is incomplete: run the same command again to rebuild it",
}
_SUBCOMMANDS = (
    _add_validate_cache,
    _add_build_cache,
    add_preblock,
    add_validate_blocks,
    _add_bench,
    _add_provenance,
    add_convert_pt,
)


def main(argv: Sequence[str] | None = None) -> int:
    """Runs the ``meshbatch`` command line; returns the exit code."""
    parser = argparse.ArgumentParser(prog="meshbatch", description=__doc__.splitlines()[0])
    parser.add_argument("-v", "--verbose", action="store_true", help="log at INFO level")
    sub = parser.add_subparsers(dest="command", required=True)
    for add in _SUBCOMMANDS:
        add(sub)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING)
    try:
        return args.run(args)
    except KeyboardInterrupt:  # Ctrl-C: no traceback, and how to go on
        if args.verbose:
            raise
        print(
            f"meshbatch {args.command}: interrupted; {_AFTER_INTERRUPT.get(args.command, '')}",
            file=sys.stderr,
        )
        return 130
    except Exception as e:  # one line for the user; -v for the traceback
        if args.verbose:
            raise
        message = " ".join(str(e).split())
        print(f"meshbatch {args.command}: error: {type(e).__name__}: {message}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
