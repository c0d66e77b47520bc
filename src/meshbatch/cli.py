"""The ``meshbatch`` command: a small dispatcher; each subcommand registers its parser and handler.

meshbatch validate-cache /data/cache          # prints a report; exit 0 valid, 1 invalid
meshbatch validate-cache /data/cache --deep   # also reads every chunk and verifies its checksum
meshbatch build-cache /data/cache a.jsonl b.txt --tokenizer tokenizer.json
meshbatch bench --all --out /tmp/bench               # kernel and pipeline-step microbenchmarks
meshbatch provenance my_project.data:make_pipeline --step 1200   # where step 1200's rows came from

A failure prints one line, ``meshbatch <command>: error: <what went wrong>``, and exits 1; ``-v``
shows the traceback instead. Ctrl-C prints one line saying how to go on (``build-cache``: run the
same command again to resume) and exits 130.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence

from .bench.bench_cli import add_bench
from .datasets.preblocked.block_cli import add_convert_pt, add_preblock, add_validate_blocks
from .pipeline.provenance_cli import add_provenance


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


_AFTER_INTERRUPT = {
    "build-cache": "the rows committed so far are kept: run the same command again to resume",
    "preblock": "the output is incomplete: run the same command again to rebuild it",
}
_SUBCOMMANDS = (
    _add_validate_cache,
    _add_build_cache,
    add_preblock,
    add_validate_blocks,
    add_bench,
    add_provenance,
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
