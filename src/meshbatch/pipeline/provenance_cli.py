"""``meshbatch provenance``: which rows, documents and token ranges made step N, as JSON lines.

    meshbatch provenance my_project.data:make_pipeline --step 1200
    meshbatch provenance my_project.data:make_pipeline --step 1200 --state ckpt/data_state.json
    meshbatch provenance my_project.data:make_pipeline --fingerprint

``module:function`` names a function of no arguments that returns the run's ``Pipeline`` (the same
dataset, key and batch sizes as training); nothing is read but the plan's tables, so it answers at
once at any step. One JSON object per row (``Provenance.records``), or the content fingerprint.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys


def add_provenance(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("provenance", help="the source, document and token range of every row of a step")
    p.add_argument("factory", help="module:function returning the run's Pipeline")
    p.add_argument("--step", type=int, action="append", default=[], help="a step (repeat for several)")
    p.add_argument("--state", help="a state_dict() JSON saved before the step (token-balanced mixtures)")
    p.add_argument("--fingerprint", action="store_true", help="print the dataset's content fingerprint")
    p.set_defaults(run=_provenance)


def load_factory(spec: str):
    """The callable ``module:function`` names.

    Raises:
        ValueError: ``spec`` without a colon, or naming nothing callable.
    """
    module, _, name = spec.partition(":")
    if not module or not name:
        raise ValueError(f"factory={spec!r} must be module:function (e.g. my_project.data:make_pipeline)")
    found = getattr(importlib.import_module(module), name, None)
    if not callable(found):
        raise ValueError(f"{spec!r} names no function in {module} (got {found!r})")
    return found


def _provenance(args: argparse.Namespace) -> int:
    from .pipeline import Pipeline

    if not args.step and not args.fingerprint:
        raise ValueError("give --step N (one or more) or --fingerprint")
    pipeline = load_factory(args.factory)()
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
