"""The splice spec: every field of ``splice-document-dataset.md``, checked once at construction.

A spec describes placements, not documents or keys: ``splice_schedule(lengths, key=..., **spec)``
turns it into a schedule for given document lengths, and a pipeline's key drives its shuffles.

    SpliceSpec(seq_len=5, content_length=3, content_start_mode="slide_within")   # the seed's example A
    SpliceSpec(seq_len=5, content_length=3, alpha=0.8)
      -> ValueError: alpha=0.8 only applies to content_start_mode='coverage_balanced'
"""

from __future__ import annotations

import dataclasses
from typing import Literal

import numpy as np

from meshbatch.arguments import (
    INT32_MAX,
    check_bool,
    check_choice,
    check_float,
    check_int,
    check_optional_int,
    check_token_id,
)
from meshbatch.kernels.internal import JitterMode, SegmentMode

Mode = Literal["splice", "slide"]
ContentStartMode = Literal["anchor_start", "slide_within", "cyclic_roll", "coverage_balanced"]
BalanceMode = Literal["by_coverage", "by_document", "by_temperature"]
MAX_ROWS = 2**32 - 1
_AXES = {"content": ("shuffle_content", "content_seed"), "offsets": ("shuffle_offsets", "offset_seed")}


@dataclasses.dataclass(frozen=True, kw_only=True)
class SpliceSpec:
    """A splice dataset's configuration, checked at construction; names follow the seed.

    See ``docs/splice.md`` for every field. ``content_length=None`` copies as many tokens as fit;
    ``window_stride`` (the seed's ``k_window``) is the window step of ``mode="slide"``.
    """

    seq_len: int
    content_length: int | None = None
    content_stride: int = 1
    offset_stride: int = 1
    window_stride: int = 1
    content_start_mode: ContentStartMode = "anchor_start"
    mode: Mode = "splice"
    min_copy_len: int = 2
    alpha: float = 0.0
    adaptive_k: bool = True
    offset_jitter: int = 0
    jitter_mode: JitterMode = "uniform"
    balance_mode: BalanceMode = "by_coverage"
    balance_tau: float = 1.0
    epoch_length: int | None = None
    shuffle_per_epoch: bool = False
    shuffle_content: bool | int = False
    shuffle_offsets: bool | int = False
    content_seed: int | None = None
    offset_seed: int | None = None
    pad_token_id: int | None = None
    eos_token_id: int | None = None
    segment_mode: SegmentMode = "prefix"

    def __post_init__(self):
        # Each checked int is stored as a Python int (a numpy scalar would reach the kernels'
        # static arguments, where equinox refuses arrays).
        ints = {"seq_len": check_int("seq_len", self.seq_len, low=1, high=INT32_MAX)}
        ints["content_length"] = check_optional_int(
            "content_length", self.content_length, low=2, high=INT32_MAX
        )
        for name in ("content_stride", "offset_stride", "window_stride"):
            ints[name] = check_int(name, getattr(self, name), low=1, high=INT32_MAX)
        ints["min_copy_len"] = check_int("min_copy_len", self.min_copy_len, low=2, high=INT32_MAX)
        ints["offset_jitter"] = check_int("offset_jitter", self.offset_jitter, low=0, high=INT32_MAX)
        ints["epoch_length"] = check_optional_int("epoch_length", self.epoch_length, low=1, high=MAX_ROWS)
        for name in ("pad_token_id", "eos_token_id"):
            ints[name] = check_token_id(name, getattr(self, name), optional=True)
        for name, value in ints.items():
            object.__setattr__(self, name, value)
        for name, choices in (
            ("mode", Mode),
            ("content_start_mode", ContentStartMode),
            ("balance_mode", BalanceMode),
            ("jitter_mode", JitterMode),
            ("segment_mode", SegmentMode),
        ):
            check_choice(name, getattr(self, name), choices)
        for name in ("alpha", "balance_tau"):
            check_float(name, getattr(self, name), low=0.0)
        for name in ("adaptive_k", "shuffle_per_epoch"):
            check_bool(name, getattr(self, name))
        for axis in _AXES:
            self._check_axis_shuffle(axis)
        if self.content_length is not None and self.content_length < self.min_copy_len:
            raise ValueError(
                f"content_length={self.content_length} < min_copy_len={self.min_copy_len}: "
                "no copy is long enough"
            )
        if self.seq_len < self.min_copy_len:
            raise ValueError(
                f"seq_len={self.seq_len} < min_copy_len={self.min_copy_len}: no frame holds a copy"
            )
        self._check_mode_fields()

    def _check_mode_fields(self) -> None:
        """Fields that the chosen mode would silently ignore are errors."""
        balanced = self.content_start_mode == "coverage_balanced"
        only = {
            "window_stride": (self.window_stride != 1, "mode='slide'", self.mode == "slide"),
            "content_length": (self.content_length is not None, "mode='splice'", self.mode == "splice"),
            "content_stride": (
                self.content_stride != 1,
                "content_start_mode in ('slide_within', 'cyclic_roll', 'coverage_balanced')",
                self.mode == "splice" and self.content_start_mode != "anchor_start",
            ),
            "offset_stride": (self.offset_stride != 1, "enumerated splice modes", self.enumerated),
            "alpha": (self.alpha != 0, "content_start_mode='coverage_balanced'", balanced),
            "offset_jitter": (self.offset_jitter != 0, "content_start_mode='coverage_balanced'", balanced),
            "adaptive_k": (not self.adaptive_k, "content_start_mode='coverage_balanced'", balanced),
            "shuffle_content": (self.shuffle_content, "enumerated modes", not balanced),
            "shuffle_offsets": (self.shuffle_offsets, "enumerated splice modes", self.enumerated),
        }
        for name, (is_set, where, applies) in only.items():
            if is_set and not applies:
                raise ValueError(f"{name}={getattr(self, name)!r} only applies to {where}")
        if self.mode == "slide" and self.content_start_mode != "anchor_start":
            raise ValueError(f"content_start_mode={self.content_start_mode!r} does not apply to mode='slide'")

    def _check_axis_shuffle(self, axis: str) -> None:
        shuffle, seed_name = _AXES[axis]
        value, seed = getattr(self, shuffle), getattr(self, seed_name)
        if not isinstance(value, bool):
            if not isinstance(value, int | np.integer):
                raise TypeError(f"{shuffle} must be a bool or an int window (got {shuffle}={value!r})")
            check_int(shuffle, value, low=2, high=INT32_MAX)  # 0 and 1 would shuffle nothing
        check_optional_int(seed_name, seed, low=0, high=INT32_MAX)
        if seed is not None and value is False:
            raise ValueError(f"{seed_name}={seed} only applies when {shuffle} is set (got {shuffle}=False)")

    def axis_shuffle(self, axis: str) -> tuple[int, int | None] | None:
        """``(window, seed)`` of the ``"content"`` or ``"offsets"`` axis's shuffle, ``None`` if it
        is not shuffled: window 0 is the whole axis, seed ``None`` is the pipeline key's."""
        shuffle, seed_name = _AXES[axis]
        value = getattr(self, shuffle)
        if value is False:
            return None
        return (0 if value is True else int(value)), getattr(self, seed_name)

    @property
    def enumerated(self) -> bool:
        return self.mode == "splice" and self.content_start_mode != "coverage_balanced"

    @property
    def needs_key(self) -> bool:
        """Whether the schedule draws anything from a key (a shuffle, or uniform jitter)."""
        jitter = self.offset_jitter > 0 and self.jitter_mode == "uniform"
        unseeded = any(
            shuffle is not None and shuffle[1] is None for shuffle in map(self.axis_shuffle, _AXES)
        )
        return self.shuffle_per_epoch or unseeded or jitter

    @property
    def cyclic(self) -> bool:
        return self.mode == "splice" and self.content_start_mode == "cyclic_roll"

    @property
    def frame_args(self) -> dict:
        """The static arguments of the frame kernels (``pool_frames`` / ``splice_frames``)."""
        if self.pad_token_id is None:
            raise ValueError("pad_token_id is required to build frames (got pad_token_id=None)")
        return dict(
            seq_len=self.seq_len,
            pad_token_id=self.pad_token_id,
            eos_token_id=self.eos_token_id,
            segment_mode=self.segment_mode,
        )


def check_lengths(doc_lengths) -> np.ndarray:
    """Document lengths as int64 ``[num_docs]``, each in ``[0, 2^31)``.

    Raises:
        TypeError: not integers (or a string).
        ValueError: not a non-empty 1-D array, or a length out of range.
    """
    if isinstance(doc_lengths, str | bytes):
        raise TypeError(f"doc_lengths must be an array of ints (got doc_lengths={doc_lengths!r})")
    lengths = np.asarray(doc_lengths)
    if lengths.ndim != 1 or lengths.shape[0] == 0:
        raise ValueError(f"doc_lengths must be a non-empty 1-D array (got shape={lengths.shape})")
    if not np.issubdtype(lengths.dtype, np.integer):
        raise TypeError(f"doc_lengths must be integers (got dtype={lengths.dtype})")
    if lengths.min() < 0 or lengths.max() >= 2**31:
        raise ValueError(f"doc_lengths must lie in [0, 2^31) (got min={lengths.min()}, max={lengths.max()})")
    return lengths.astype(np.int64)
