"""Where each row of a batch came from, computed from its plan: no token is read.

A batch is a pure function of (dataset, key, step), so the plan of a step names, for every row,
its example, and the dataset's host half turns that into token ranges (the spans fetch would
read, or a device-resident document's range). ``RowSources`` is that answer per row and span
slot; ``Pipeline.provenance(step)`` adds the step's stream coordinates (``Provenance``)::

    CausalLMDataset(cache, seq_len=4), row 1 of step 0 -> example 7
        source "/data/cache", doc 2 (the cache row holding token 28), doc_start 3,
        start 28, length 4, row_offset 0: batch.tokens[1, 0:4] == cache tokens [28, 32)

``start`` is in the source's flat token stream (a ``TokenCache``'s concatenated rows; for
documents given as arrays, their concatenation), ``doc`` the source row (document) that holds
the span's first token and ``doc_start`` the offset there (a causal window may run on into the
next documents), ``row_offset`` where the span's first token lies in the batch row. Positions
of a row no span covers hold structure the build adds (splice padding and EOS, preblocked
markers and padding). Unused span slots have ``length`` 0 and ``doc`` -1.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from typing import Any

import numpy as np


@dataclasses.dataclass(frozen=True)
class RowSources:
    """Per row (``[n]``) and per span slot (``[n, k]``) where a dataset's planned rows come from.

    Attributes:
        component: ``object[n]`` the mixture component's name ("" outside a mixture).
        example: ``int64[n]`` the example within that (component's) dataset.
        source: ``object[n, k]`` the source's name (a cache's path), "" for an unused slot.
        doc, doc_start, start, length, row_offset: ``int64[n, k]``; see the module docstring.
    """

    component: np.ndarray
    example: np.ndarray
    source: np.ndarray
    doc: np.ndarray
    doc_start: np.ndarray
    start: np.ndarray
    length: np.ndarray
    row_offset: np.ndarray

    @classmethod
    def empty(cls, n: int, k: int) -> RowSources:
        """``n`` rows of ``k`` unused slots."""
        return cls(
            component=np.full(n, "", object),
            example=np.zeros(n, np.int64),
            source=np.full((n, k), "", object),
            doc=np.full((n, k), -1, np.int64),
            doc_start=np.zeros((n, k), np.int64),
            start=np.zeros((n, k), np.int64),
            length=np.zeros((n, k), np.int64),
            row_offset=np.zeros((n, k), np.int64),
        )

    @property
    def slots(self) -> int:
        return self.source.shape[1]

    def put(self, rows: np.ndarray, part: RowSources) -> None:
        """Writes ``part`` (rows ``rows`` of this, in order) into this one's first slots."""
        k = part.slots
        self.component[rows] = part.component
        self.example[rows] = part.example
        for name in ("source", "doc", "doc_start", "start", "length", "row_offset"):
            getattr(self, name)[rows, :k] = getattr(part, name)


def source_name(source) -> str:
    """A source's name in provenance: its path, else its ``repr``."""
    path = getattr(source, "path", None)
    return str(path) if path else repr(source)


def locate_docs(source, starts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(doc, doc_start)`` of flat token positions ``starts`` of ``source``: the row holding
    each and the offset in it, from the source's row offsets (``doc_offsets()``: a lazily opened
    cache reads them once); ``(-1, starts)`` for a source without rows."""
    offsets_of = getattr(source, "doc_offsets", None)
    starts = np.asarray(starts, np.int64)
    if offsets_of is None:
        return np.full(starts.shape, -1, np.int64), starts
    offsets = np.asarray(offsets_of())
    doc = np.searchsorted(offsets, starts, side="right").astype(np.int64) - 1
    return doc, starts - offsets[np.clip(doc, 0, len(offsets) - 1)]


def from_spans(sources, source: np.ndarray, start: np.ndarray, length: np.ndarray, example) -> RowSources:
    """Row sources of spans laid one after another in each row (causal windows, preblocked
    blocks): each span's ``row_offset`` is the lengths of the row's spans before it."""
    n, k = source.shape
    out = RowSources.empty(n, k)
    out.example[:] = np.asarray(example, np.int64)
    used = length > 0
    names = np.asarray([source_name(s) for s in sources] + [""], object)
    out.source[:] = np.where(used, names[np.where(used, source, len(sources))], "")
    for i, s in enumerate(sources):
        mine = used & (source == i)
        if mine.any():
            out.doc[mine], out.doc_start[mine] = locate_docs(s, start[mine])
    out.start[:] = np.where(used, start, 0)
    out.length[:] = np.where(used, length, 0)
    out.row_offset[:] = np.cumsum(out.length, axis=1) - out.length
    return out


@dataclasses.dataclass(frozen=True)
class Provenance:
    """Where every row of a step came from (``Pipeline.provenance``).

    Attributes:
        step: the step.
        stream_index: ``object[n]`` of Python ints: each row's index in the endless stream
            (``offset(step) + row``; any size).
        position, epoch: ``int64[n]`` the row's position in its epoch and the epoch.
        padding: ``bool[n]`` rows of a padded final step that hold zeros, not an example.
        rows: the ``RowSources``; padding rows have no spans.
    """

    step: int
    stream_index: np.ndarray
    position: np.ndarray
    epoch: np.ndarray
    padding: np.ndarray
    rows: RowSources

    def __len__(self) -> int:
        return len(self.position)

    def records(self) -> list[dict[str, Any]]:
        """One JSON-able dict per row: its coordinates and its spans (unused slots left out)."""
        r = self.rows
        out = []
        for i in range(len(self)):
            spans = [
                {
                    "source": r.source[i, j],
                    "doc": int(r.doc[i, j]),
                    "doc_start": int(r.doc_start[i, j]),
                    "start": int(r.start[i, j]),
                    "length": int(r.length[i, j]),
                    "row_offset": int(r.row_offset[i, j]),
                }
                for j in range(r.slots)
                if r.length[i, j] > 0
            ]
            out.append({
                "step": self.step, "row": i, "stream_index": int(self.stream_index[i]),
                "position": int(self.position[i]), "epoch": int(self.epoch[i]),
                "padding": bool(self.padding[i]), "component": r.component[i],
                "example": int(r.example[i]), "spans": spans,
            })  # fmt: skip
        return out


def source_identity(source) -> dict[str, Any]:
    """What identifies a source's contents without reading them: its path, its writer's
    ``cache_id`` (a random id drawn once per cache written), its rows and tokens."""
    ledger = getattr(source, "ledger", None)
    out = {
        "name": source_name(source),
        "cache_id": getattr(ledger, "cache_id", None),
        "num_tokens": int(getattr(source, "num_tokens", -1)),
    }
    for attr in ("num_rows", "num_blocks", "block_size"):
        if hasattr(source, attr):
            out[attr] = int(getattr(source, attr))
    return out


def _jsonable(value):
    if isinstance(value, np.ndarray) or hasattr(value, "__array__"):
        array = np.asarray(value)
        return {"dtype": str(array.dtype), "shape": list(array.shape),
                "sha256": hashlib.sha256(np.ascontiguousarray(array).tobytes()).hexdigest()}  # fmt: skip
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    if isinstance(value, int | float | str | bool) or value is None:
        return value
    return repr(value)


def describe_content(dataset) -> dict[str, Any]:
    """The JSON-able description ``content_fingerprint`` hashes: a mixture's components (by
    name, each described the same way), its weights as its schedule applies them and its
    configuration; a dataset's kind, configuration (``repr``) and sources' identities."""
    out: dict[str, Any] = {"kind": type(dataset).__name__, "seq_len": getattr(dataset, "seq_len", None)}
    names, children = getattr(dataset, "names", None), getattr(dataset, "children", None)
    if names is not None and children is not None:
        out["components"] = {name: describe_content(c) for name, c in zip(names, children, strict=True)}
        for attr in ("weights", "rows", "block_size", "stop_strategy", "compat", "baseline"):
            if hasattr(dataset, attr):
                out[attr] = _jsonable(getattr(dataset, attr))
        return out
    out["config"] = repr(dataset)
    out["sources"] = [source_identity(s) for s in getattr(dataset, "sources", ())]
    if getattr(dataset, "doc_rows", None) is not None:  # a splice selection
        doc_source = getattr(dataset, "doc_source", None)
        out["documents"] = {
            "source": None if doc_source is None else source_identity(doc_source),
            "rows": _jsonable(dataset.doc_rows),
            "lengths": _jsonable(dataset.doc_lengths),
        }
    return out


def content_fingerprint(dataset) -> str:
    """A hex digest of ``describe_content(dataset)``: equal for the same components, caches and
    weights; a rewritten or re-bucketed cache (a new ``cache_id``, other rows or tokens), another
    component or other weights change it. Computed without reading a token."""
    text = json.dumps(describe_content(dataset), sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:32]
