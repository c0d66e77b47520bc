"""The ``meshbatch preblock`` and ``meshbatch validate-blocks`` subcommands.

    meshbatch preblock OUT a.jsonl b.txt --block-size 128 [--shuffle-level document]
                       [--escape-literal-markers] [--tokenizer tokenizer.json]
    meshbatch validate-blocks OUT [--carry-open-doc] [--literal-heuristics] [--anomalies out.json]
    meshbatch convert-pt SRC CACHE      legacy chunk*.pt sequences -> a token cache (torch extra)

``validate-blocks`` exits 0 when the data is clean, 1 when it found anomalies and 2 when the input
cannot be read.
"""

from __future__ import annotations

import argparse
import json
import sys


def add_preblock(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("preblock", help="pack documents into [DOC] ... [EOD] blocks of a fixed size")
    p.add_argument("output", help="directory to write, or a gs:// / s3:// URL")
    p.add_argument(
        "inputs", nargs="+", help=".txt / .jsonl files (optionally .gz), or one token cache directory or URL"
    )
    p.add_argument("--block-size", type=int, required=True, help="tokens per block")
    p.add_argument("--shuffle-level", choices=["none", "document", "segment"], default="document")
    p.add_argument("--seed", type=int, default=0, help="shuffle seed (default 0)")
    p.add_argument("--rule", choices=["ffd", "greedy"], default="ffd", help="packing rule (default ffd)")
    p.add_argument("--buffer-docs", type=int, default=1024, help="documents grouped per ffd buffer")
    p.add_argument("--escape-literal-markers", action="store_true", help="escape literal [DOC]/[EOD] text")
    p.add_argument("--tokenizer", help="local tokenizer.json (Hugging Face tokenizers); default: UTF-8 bytes")
    p.add_argument("--vocab-size", type=int, help="ordinary ids are [0, N) (default: the tokenizer's)")
    for name in ("doc-id", "eod-id", "pad-id"):
        p.add_argument(f"--{name}", type=int, help="structural id (default: after the vocabulary)")
    p.add_argument("--text-key", default="text", help="JSONL field holding the text (default: text)")
    p.add_argument(
        "--text-docs", choices=["file", "line"], default="file", help="a .txt file is one doc or one per line"
    )
    p.add_argument(
        "--format", choices=["zarr", "npy"], default="zarr", help="a TensorStore store or chunk*.npy files"
    )
    p.add_argument("--overwrite", action="store_true", help="replace existing preblocked data at OUTPUT")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(run=_preblock)


def _preblock(args: argparse.Namespace) -> int:
    from meshbatch.cache import HFTokenizer

    from .block_writer import preblock

    header = preblock(
        args.output,
        args.inputs,
        block_size=args.block_size,
        shuffle_level=args.shuffle_level,
        key=args.seed,
        rule=args.rule,
        buffer_docs=args.buffer_docs,
        escape_literal_markers=args.escape_literal_markers,
        tokenizer=HFTokenizer(args.tokenizer, add_special_tokens=False) if args.tokenizer else None,
        doc_id=args.doc_id,
        eod_id=args.eod_id,
        pad_id=args.pad_id,
        vocab_size=args.vocab_size,
        text_key=args.text_key,
        text_docs=args.text_docs,
        output_format=args.format,
        if_exists="overwrite" if args.overwrite else "error",
        progress=False if args.no_progress else None,
    )
    fill = header.fill
    print(
        f"wrote {args.output}: {header.counts['documents']} documents, {header.num_blocks} blocks of "
        f"{header.block_size}; fill {fill['fill']:.4f} ({header.rule}; "
        f"plain greedy {fill['greedy_fill']:.4f}); "
        f"ids doc={header.doc_id} eod={header.eod_id} pad={header.pad_id}"
    )
    return 0


def add_validate_blocks(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "validate-blocks", help="check the [DOC]/[EOD] structure of preblocked data (exit 1: anomalies)"
    )
    p.add_argument("path", help="a preblocked store (a directory or URL) or a directory of chunk*.npy files")
    p.add_argument(
        "--carry-open-doc", action="store_true", help="a document may continue into the next block"
    )
    p.add_argument("--literal-heuristics", action="store_true", help="down-rank likely literal markers")
    p.add_argument(
        "--literal-window", type=int, default=8, help="H2's 'nearby': positions searched for a [DOC]"
    )
    p.add_argument("--anomalies", help="write every anomaly, with context, to this JSON file")
    p.add_argument("--vocab-size", type=int, help="override (required without a preblock header)")
    for name in ("doc-id", "eod-id", "pad-id"):
        p.add_argument(f"--{name}", type=int, help="override (required without a preblock header)")
    p.add_argument("--batch-blocks", type=int, default=1024, help="blocks per kernel call")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(run=_validate_blocks)


def _validate_blocks(args: argparse.Namespace) -> int:
    from .block_validation import validate_path

    try:
        report = validate_path(
            args.path,
            carry_open_doc=args.carry_open_doc,
            literal_heuristics=args.literal_heuristics,
            literal_window=args.literal_window,
            doc_id=args.doc_id,
            eod_id=args.eod_id,
            pad_id=args.pad_id,
            vocab_size=args.vocab_size,
            batch_blocks=args.batch_blocks,
            progress=False if args.no_progress else None,
        )
    except Exception as e:  # exit 2, never 1 (1 means anomalies were found); -v re-raises
        if args.verbose:
            raise
        message = " ".join(str(e).split())
        print(
            f"meshbatch validate-blocks: cannot read {args.path}: {type(e).__name__}: {message}",
            file=sys.stderr,
        )
        return 2
    print(report.format())
    if args.anomalies:
        with open(args.anomalies, "w") as f:
            json.dump(report.to_json(), f, indent=1)
    return 0 if report.ok else 1


def add_convert_pt(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "convert-pt", help="write legacy chunk*.pt sequences (lists of 1-D tensors) once as a token cache"
    )
    p.add_argument("source", help="directory of chunk*.pt files, each a list of 1-D integer tensors")
    p.add_argument("output", help="the token cache to write (a directory, or a gs:// / s3:// URL)")
    p.add_argument("--if-exists", choices=["error", "overwrite"], default="error")
    p.set_defaults(run=_convert_pt)


def _convert_pt(args: argparse.Namespace) -> int:
    from .block_sources import convert_pt_sequences

    rows = convert_pt_sequences(args.source, args.output, if_exists=args.if_exists)
    print(f"wrote {rows} sequences from {args.source} to the token cache {args.output}")
    return 0
