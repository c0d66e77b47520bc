"""``chunk*.pt`` files, the preblocked spec's own artifacts, read through
``torch.load(..., weights_only=True)`` (the optional ``meshbatch[torch]`` extra, CPU torch).

Two forms (``preblocked-chunks.md``):

* **preblocked**: each file one 2-D integer tensor ``[N, block_size]``. A directory of them is
  read by ``BlockDataset`` / ``open_blocks`` exactly like ``chunk*.npy`` matrices (lazily: a file's
  shape from a memory-mapped load, its rows on first use, through the same LRU);
* **legacy**: each file a list (or tuple) of 1-D integer tensors, variable-length sequences.
  They are documents: ``convert_pt_sequences(src, out)`` (``meshbatch convert-pt SRC OUT``) writes
  them once as a token cache, one row per sequence, files in natural order, which
  ``BlockDataset`` packs on the fly (its legacy mode) or ``meshbatch preblock`` writes as a store.

Anything else is refused by name (``NotPlainTensors``): a pickle ``weights_only=True`` will not
load (a class, a function: code that would run on load), or tensors of another form (a dict, a
float tensor, a 3-D tensor, a list holding a non-tensor).

    chunk0.pt  tensor([[5, 6, 7, 8], [9, 0, 0, 0]])    ->  rows [5 6 7 8], [9 0 0 0]
    chunk0.pt  [tensor([5, 6, 7]), tensor([8, 9])]      ->  convert-pt: documents [5 6 7], [8 9]
"""

from __future__ import annotations

import logging
import os

import numpy as np

logger = logging.getLogger(__name__)


class NotPlainTensors(ValueError):
    """A ``.pt`` file that is not plain integer tensors in one of the two chunk forms."""


def _torch():
    try:
        import torch
    except ImportError as e:
        raise ImportError(
            "reading chunk*.pt files needs torch: pip install 'meshbatch[torch]' (the CPU build is enough)"
        ) from e
    return torch


def load_pt(file: str, *, mmap: bool = False):
    """The contents of a ``chunk*.pt`` file: a 2-D ``torch.Tensor`` (preblocked) or a list of 1-D
    tensors (legacy), loaded with ``weights_only=True`` (``mmap``: storages mapped, not read).

    Raises:
        ImportError: torch is not installed (naming the extra).
        NotPlainTensors: anything but integer tensors in those two forms, naming the file.
    """
    torch = _torch()
    try:
        obj = torch.load(file, map_location="cpu", weights_only=True, mmap=mmap)
    except Exception as e:  # weights_only's refusal is an UnpicklingError; a torn file a RuntimeError
        raise NotPlainTensors(
            f"{file}: torch.load(weights_only=True) refused it, so it is not plain tensors "
            f"({type(e).__name__}: {str(e).splitlines()[0] if str(e) else e!r})"
        ) from e

    def integer(t) -> bool:
        return (
            isinstance(t, torch.Tensor)
            and not t.is_floating_point()
            and not t.is_complex()
            and t.dtype != torch.bool
        )

    if isinstance(obj, torch.Tensor):
        if obj.ndim != 2 or not integer(obj):
            raise NotPlainTensors(
                f"{file} holds a {obj.dtype} tensor of shape {tuple(obj.shape)}; a chunk is an integer "
                "[rows, block_size] tensor or a list of 1-D integer tensors"
            )
        return obj
    if isinstance(obj, list | tuple):
        for i, t in enumerate(obj):
            if not (integer(t) and t.ndim == 1):
                what = (
                    f"a {t.dtype} tensor of shape {tuple(t.shape)}"
                    if isinstance(t, torch.Tensor)
                    else repr(type(t))
                )
                raise NotPlainTensors(f"{file}: item {i} of its list is {what}, not a 1-D integer tensor")
        return list(obj)
    raise NotPlainTensors(
        f"{file} holds a {type(obj).__name__}; a chunk is an integer [rows, block_size] tensor or a list of "
        "1-D integer tensors"
    )


def pt_matrix(file: str, *, mmap: bool = False) -> np.ndarray:
    """A preblocked ``chunk*.pt`` as a numpy array (a view of the mapped storage with ``mmap``).

    Raises:
        NotPlainTensors: not plain tensors, or the legacy form (pointing to ``convert-pt``).
    """
    obj = load_pt(file, mmap=mmap)
    if isinstance(obj, list):
        raise NotPlainTensors(
            f"{file} holds a list of {len(obj)} sequences (the legacy form), not a [rows, block_size] "
            "matrix: convert them once into a token cache (meshbatch convert-pt SRC OUT) and read that"
        )
    return obj.numpy()


def pt_files(src: str) -> list[str]:
    """``chunk*.pt`` files of ``src`` in natural order."""
    from .block_store import chunk_files

    return [f for f in chunk_files(src) if f.endswith(".pt")]


def convert_pt_sequences(src: str, out: str, *, if_exists: str = "error") -> int:
    """Writes the legacy ``chunk*.pt`` sequences of ``src`` as a token cache at ``out`` (one row per
    sequence, files in natural order); returns the rows written.

    Raises:
        FileNotFoundError: no ``chunk*.pt`` files in ``src``.
        NotPlainTensors: a file that is not the legacy form (a matrix, or not plain tensors).
        ValueError: ids outside int32.
    """
    from meshbatch.cache import CacheWriter

    files = pt_files(src)
    if not files:
        raise FileNotFoundError(f"no chunk*.pt files in {src}")
    rows = 0
    with CacheWriter(out, if_exists=if_exists) as writer:
        for file in files:
            obj = load_pt(file)
            if not isinstance(obj, list):
                raise NotPlainTensors(
                    f"{file} holds a [rows, block_size] matrix (the preblocked form), not a list of "
                    "sequences: BlockDataset reads such a directory as it is"
                )
            docs = [t.numpy() for t in obj]
            for i, doc in enumerate(docs):
                if doc.size and (doc.min() < -(2**31) or doc.max() > 2**31 - 1):
                    raise ValueError(f"{file}: sequence {i} holds ids that do not fit int32")
            writer.write(docs)
            rows += len(docs)
            logger.info("%s: %d sequences", os.path.basename(file), len(docs))
    return rows
