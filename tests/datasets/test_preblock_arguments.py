"""Random bad arguments at the preblock entry points (the approach of ``test_fuzz_arguments``):
every failure is a ``TypeError``, ``ValueError`` or ``IndexError`` (``FileNotFoundError`` for a
path that does not exist) naming the parameter. A deterministic grid of trials: every parameter
with ``PER_PARAM`` values of ``BAD`` (rotating, so every value is used), run with the shape checks
off (the errors a user sees)."""

from __future__ import annotations

import itertools
import json
import os

import numpy as np
import pytest
from argument_fuzz import ALLOWED, Call, grid
from shape_checks import unchecked

from meshbatch import ShuffleSpec
from meshbatch.datasets.preblocked import (
    BlockDataset,
    CacheBlockDataset,
    MLMMasking,
    PackSpec,
    escape,
    plan_layout,
    preblock,
    validate_array,
    validate_path,
)

PER_PARAM = 4


@pytest.fixture(scope="module")
def calls(tmp_path_factory):
    root = tmp_path_factory.mktemp("arguments")
    text = root / "docs.jsonl"
    text.write_text("".join(json.dumps({"text": t}) + "\n" for t in ["one", "two words", "three [DOC] x"]))
    store = str(root / "store")
    preblock(store, [str(text)], block_size=8, progress=False)
    fresh = (str(root / f"out{i}") for i in itertools.count())
    ids = dict(doc_id=257, eod_id=258, pad_id=259, vocab_size=257)
    return {
        "PackSpec": Call(PackSpec, block_size=8, shuffle_level="none", rule="ffd", buffer_docs=4),
        "plan_layout": Call(plan_layout, lengths=np.array([3, 9, 1]), spec=PackSpec(8), key=0),
        "MLMMasking": Call(
            MLMMasking,
            key=0,
            mask_id=260,
            vocab_size=257,
            special_ids=(257, 258, 259),
            rate=0.15,
            mode="static",
            ignore_id=-100,
            mask_fraction=0.8,
            random_fraction=0.1,
        ),
        "BlockDataset": Call(
            BlockDataset,
            aliases={"paths": ("path",)},
            paths=store,
            shuffle=ShuffleSpec("none"),
            **ids,
        ),
        "CacheBlockDataset": Call(
            CacheBlockDataset,
            aliases={"paths": ("path",)},
            paths=os.path.join(store, "tokens"),
            pack=PackSpec(8),
            shuffle=ShuffleSpec("none"),
            field="input_ids",
            **ids,
        ),
        "preblock": Call(
            lambda output, **kw: preblock(
                next(fresh) if isinstance(output, str) and output == "fresh" else output, **kw
            ),
            aliases={"text_key": ("field",)},
            output="fresh",
            inputs=[str(text)],
            block_size=8,
            shuffle_level="document",
            key=1,
            rule="ffd",
            buffer_docs=4,
            escape_literal_markers=True,
            text_key="text",
            text_docs="file",
            output_format="zarr",
            if_exists="error",
            progress=False,
            **ids,
        ),
        "validate_path": Call(
            validate_path,
            path=store,
            carry_open_doc=True,
            literal_heuristics=True,
            literal_window=3,
            batch_blocks=4,
            context=2,
            progress=False,
            **ids,
        ),
        "validate_array": Call(
            validate_array,
            blocks=np.array([[257, 1, 258, 259]]),
            carry_open_doc=False,
            literal_window=2,
            **ids,
        ),
        "escape": Call(escape, text="a[DOC]b"),
    }


def test_bad_arguments_raise_named_errors(calls, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # a bad path such as "abc" that preblock accepts lands here
    failures, tried = [], 0
    with unchecked():
        for name, param, bad in grid(calls, PER_PARAM):
            call = calls[name]
            tried += 1
            try:
                call.fn(**dict(call.kwargs, **{param: bad}))
            except (*ALLOWED, FileNotFoundError) as error:  # a path that does not exist
                if not any(alias in str(error) for alias in call.names(param)):
                    failures.append(f"{name}({param}={bad!r}): {type(error).__name__}: {error}")
            except Exception as error:
                failures.append(f"{name}({param}={bad!r}): internal {type(error).__name__}: {error}")
    assert tried == PER_PARAM * sum(len(call.kwargs) for call in calls.values())
    assert not failures, "\n".join(failures[:25])
