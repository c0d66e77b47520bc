"""What a token cache on disk must satisfy, and the named errors when it does not.

Two kinds of check live here. *Cache checks* look at what is on disk; a failure is a
``CacheIntegrityError`` (a ``ValueError``) naming the file (``where``: the array's path) and the
bad value::

    offsets[0] disagrees       /c/input_ids/offsets: offsets[0] = 6 rows on disk, but the ledger commits 7
    offsets not monotone       /c/input_ids/offsets not monotone: row 2 spans [9, 4)
    offsets past the data      /c/input_ids/offsets reach token 99, but the data chunk holding token 98 ...

*Argument checks* refuse what a caller passes at the host boundary (``TypeError`` for a wrong type,
``ValueError`` for a wrong value), naming the parameter: ``starts must be integers (got dtype
float64)``. What reading raises is ``reads.py``'s.
"""

from __future__ import annotations

import os

import numpy as np
import tensorstore as ts

from meshbatch.arguments import check_int


class CacheIntegrityError(ValueError):
    """A token cache on disk is damaged or inconsistent: never read as valid tokens."""


class CacheChangedError(CacheIntegrityError):
    """A cache changed under an open reader in a way that invalidates what it loaded (replaced, shrunk)."""


def check_row_count(on_disk: int, *, rows: int, finished: bool, where: str) -> None:
    """Checks ``offsets[0]`` (``on_disk``, the row count the offsets array records) against the
    ``rows`` the ledger commits, before any other offset is read: at least as many, and as many once
    the ledger is ``finished`` (before, a writer may have written offsets for rows it has not
    committed yet)."""
    if on_disk < rows or (finished and on_disk != rows):
        raise CacheIntegrityError(
            f"{where}: offsets[0] = {on_disk} rows on disk, but the ledger commits {rows} rows"
        )


def check_offsets(raw: np.ndarray, *, rows: int, finished: bool, where: str) -> np.ndarray:
    """Checks ``raw``, ``offsets[0 : rows + 1]`` as read from disk (``raw[0]`` against the ledger:
    ``check_row_count``), and returns them normalised to start at 0: row ``i`` spans tokens
    ``[out[i], out[i + 1])``."""
    check_row_count(int(raw[0]), rows=rows, finished=finished, where=where)
    offsets = np.array(raw, dtype=np.int64)
    offsets[0] = 0
    check_monotone(offsets, where=where)
    return offsets


def check_monotone(offsets: np.ndarray, *, where: str, first: int = 0) -> None:
    """Raises unless ``offsets`` (of rows ``first``, ``first + 1``, ...) never decrease."""
    bad = np.flatnonzero(offsets[1:] < offsets[:-1])
    if bad.size:
        i = int(bad[0])
        raise CacheIntegrityError(
            f"{where} not monotone: row {first + i} spans [{offsets[i]}, {offsets[i + 1]})"
        )


def check_dtype(found: np.dtype, expected: np.dtype | None, *, where: str) -> None:
    """Raises when ``expected`` is given and differs from the on-disk ``found``."""
    if expected is not None and np.dtype(found) != np.dtype(expected):
        raise CacheIntegrityError(f"{where} has dtype {np.dtype(found)}, expected {np.dtype(expected)}")


def check_data_end(end: int, *, data: ts.TensorStore, recorded: int | None, where: str) -> None:
    """Checks that offsets ending at token ``end`` stay within the data that was written.

    The ledger's token count (``recorded``, when it records one) must equal ``end``, and the data
    chunk holding token ``end - 1`` must exist: with ``fill_missing_data_reads`` off, reading that one
    token fails if it does not (one chunk decode, no directory listing).
    """
    if recorded is not None and recorded != end:
        raise CacheIntegrityError(f"{where} reach token {end}, but the ledger records {recorded} tokens")
    if end == 0:
        return
    if end > data.domain.exclusive_max[0]:
        raise CacheIntegrityError(
            f"{where} reach token {end}, beyond the data array's shape {data.domain.shape[0]}"
        )
    try:
        data[end - 1 : end].read().result()
    except ValueError as e:
        raise CacheIntegrityError(
            f"{where} reach token {end}, but the data chunk holding token {end - 1} cannot be read: {e}"
        ) from e


def check_extent(end: int, *, data: ts.TensorStore, offsets: ts.TensorStore, rows: int, where: str) -> None:
    """Checks that a finished part stops where its last offset says: what lies past it is fill.

    Writers never write past the last row (Levanter's and meshbatch's, whose resume zeroes rows
    it truncates), so the rest of the chunk holding the last token reads 0, and so does
    ``offsets[rows + 1]`` (or its chunk is not stored). A last offset moved back, or a chunk copied
    over from a larger cache, leaves tokens there: one chunk decode, no checksum needed::

        offsets [3, 2, 3, 6], data [5, 6, 7, 8, 9, 9, 0, 0]   -> fine
        offsets [3, 2, 3, 5], data [5, 6, 7, 8, 9, 9, 0, 0]   -> data[5] = 9 past the last row
    """
    size = int(data.chunk_layout.read_chunk.shape[0] or 1)
    stop = min(-(-end // size) * size, data.domain.exclusive_max[0]) if end % size else end + 1
    stop = min(stop, data.domain.exclusive_max[0])
    with ts.Batch() as batch:
        tail = data[end:stop].read(batch=batch) if stop > end else None
        after = offsets[rows + 1 : rows + 2].read(batch=batch)
    for name, future, first in (("data", tail, end), ("offsets", after, rows + 1)):
        if future is None:
            continue
        try:
            values = future.result()
        except ValueError as e:
            if "NOT_FOUND" in str(e):
                continue  # nothing stored past the end
            raise CacheIntegrityError(
                f"{where}: the chunk past the last row of {name} cannot be read: {e}"
            ) from e
        bad = np.flatnonzero(values)
        if bad.size:
            at, value = first + int(bad[0]), int(values[bad[0]])
            raise CacheIntegrityError(
                f"{where}: the last row ends at token {end}, but {name}[{at}] = {value} past it "
                "is not the fill value 0 (a last offset moved back, or a chunk from another cache)"
            )


# -- arguments at the host boundary -------------------------------------------------------------


def check_path(name: str, value) -> str:
    """A path or TensorStore URL as a ``str`` (``os.PathLike`` accepted)."""
    if isinstance(value, os.PathLike):
        value = os.fspath(value)
    if not isinstance(value, str) or not value:
        raise TypeError(f"{name} must be a non-empty str or os.PathLike (got {name}={value!r})")
    return value


def check_name(name: str, value) -> str:
    """A non-empty string (a field or shard name)."""
    if not isinstance(value, str):
        raise TypeError(f"{name} must be a str (got {name}={value!r})")
    if not value:
        raise ValueError(f"{name} must not be empty (got {name}={value!r})")
    return value


def check_component(name: str, value) -> str:
    r"""One path component from a caller (a field, shard or output name): it names a directory
    inside the one it is joined to and can never leave it.

        "input_ids", "part-0", "shard.1"    accepted
        "", ".", "..", "a/b", "../x", "/abs", "a\b", "a\0b"   ValueError naming the parameter
    """
    value = check_name(name, value)
    bad = (
        value in (".", "..") or any(sep in value for sep in ("/", "\\", "\0", os.sep)) or os.path.isabs(value)
    )
    if bad:
        raise ValueError(
            f"{name} must be a single path component: no '/', '\\' or NUL, not absolute, not '.' "
            f"or '..' (got {name}={value!r})"
        )
    return value


def check_relative_path(name: str, value) -> str:
    """A relative path below a directory, ``/``-separated, each part a ``check_component`` (a shard
    name: ``"part-0"``, ``"sub/part-1"``; never ``"../x"``, ``"a/../b"``, ``"a//b"`` or ``"/abs"``).
    """
    value = check_name(name, value)
    if value.startswith("/") or os.path.isabs(value):
        raise ValueError(f"{name} must be a relative path inside the cache (got {name}={value!r})")
    for part in value.split("/"):
        try:
            check_component(name, part)
        except ValueError:
            raise ValueError(
                f"{name} must be a relative path of names separated by '/': no '..', '.' or empty part, "
                f"no '\\' or NUL (got {name}={value!r})"
            ) from None
    return value


def as_token_dtype(name: str, value) -> np.dtype:
    """A numpy integer dtype; ``"float32"`` and ``"banana"`` are refused by name."""
    if isinstance(value, bool) or value is None:
        raise TypeError(f"{name} must be an integer dtype (got {name}={value!r})")
    try:
        dtype = np.dtype(value)
    except TypeError as e:
        raise TypeError(f"{name}={value!r} is not a numpy dtype") from e
    if not np.issubdtype(dtype, np.integer):
        raise ValueError(f"{name} must be an integer dtype such as int32 or uint16 (got {name}={dtype})")
    return dtype


def as_index_array(name: str, value) -> np.ndarray:
    """Integers as a 1-D int64 array (a scalar becomes ``[value]``), refusing anything else by name.

    Raises:
        TypeError: strings, floats, bools, objects: anything that is not an integer array.
        ValueError: more than one dimension, or a value outside int64.
    """
    if isinstance(value, np.ndarray) and value.dtype.kind == "i" and value.ndim <= 1:  # the hot path
        return value.reshape(-1).astype(np.int64, copy=False)
    if type(value) is int and -(2**63) <= value < 2**63:
        return np.array([value], dtype=np.int64)
    if isinstance(value, str | bytes):
        raise TypeError(f"{name} must be integers (got a {type(value).__name__}: {name}={value!r})")
    try:
        arr = np.asarray(value)
    except (ValueError, OverflowError) as e:  # ragged nesting
        raise TypeError(f"{name} must be a 1-D array of integers ({e})") from e
    if arr.ndim > 1:
        raise ValueError(f"{name} must be 1-D (got shape {arr.shape})")
    if arr.size == 0:
        return np.zeros(0, dtype=np.int64)
    if arr.dtype == object and all(isinstance(v, int) and not isinstance(v, bool) for v in arr.reshape(-1)):
        big = max(arr.reshape(-1), key=abs)
        raise ValueError(f"{name} must fit int64 (got {name} value {big})")
    if arr.dtype == np.bool_ or not np.issubdtype(arr.dtype, np.integer):
        raise TypeError(f"{name} must be integers (got dtype {arr.dtype})")
    if arr.dtype == np.uint64 and int(arr.max()) > np.iinfo(np.int64).max:
        raise ValueError(f"{name} must fit int64 (got {name} value {int(arr.max())})")
    return arr.reshape(-1).astype(np.int64, copy=False)


def check_out_buffer(name: str, out, *, at) -> None:
    """``out`` a 1-D integer numpy array and ``at`` a non-negative int (a read's destination)."""
    if not isinstance(out, np.ndarray) or out.ndim != 1 or not np.issubdtype(out.dtype, np.integer):
        got = f"{type(out).__name__} {getattr(out, 'dtype', '')} {getattr(out, 'shape', '')}"
        raise TypeError(f"{name} must be a 1-D integer numpy array (got {got})")
    check_int("at", at, low=0)
