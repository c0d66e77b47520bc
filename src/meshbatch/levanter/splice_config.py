"""The seed's splice configs: ``splice_multi_document`` and ``splice_single_document``."""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from haliax import Axis
from levanter.data.dataset import AsyncDataset, ListAsyncDataset
from levanter.models.lm_model import LmExample
from levanter.utils.jax_utils import local_cpu_mesh

from meshbatch.cache import TokenCache
from meshbatch.datasets.splice.indexed import splice_validation_set
from meshbatch.datasets.splice.selection import select_documents
from meshbatch.datasets.splice.splice_dataset import SpliceLMDataset
from meshbatch.datasets.splice.splice_spec import SpliceSpec

from .async_datasets import lm_examples, loader_key
from .config import MeshbatchLMConfig
from .sources import ConfigError, _checked

SPLICE_FIELDS = tuple(f.name for f in dataclasses.fields(SpliceSpec) if f.name != "seq_len")


# Every SpliceSpec field but seq_len (the model's), with its type and default: draccus parses
# them from YAML and the checks stay SpliceSpec's own.
_SpliceFields = dataclasses.make_dataclass(
    "_SpliceFields",
    [
        (f.name, typing.get_type_hints(SpliceSpec)[f.name], dataclasses.field(default=f.default))
        for f in dataclasses.fields(SpliceSpec)
        if f.name in SPLICE_FIELDS
    ],
    frozen=True,
)
_SpliceFields.__module__ = __name__
_SpliceFields.__doc__ = "Every ``SpliceSpec`` field (``docs/splice.md``), with the seed's names and defaults."


@dataclass(frozen=True)
class _SelectionFields:
    """The seed's document selection (``meshbatch.select_documents``)."""

    num_docs: int = 1
    doc_index: int | None = None
    min_doc_length: int | None = None
    max_doc_length: int | None = None
    doc_select_mode: Literal["first", "longest", "shortest", "random"] = "longest"
    restrict_to_training_subset: bool = False
    max_train_batches: int | None = None
    initial_batch_size: int | None = None
    selection_seed: int = 0
    """seeds ``doc_select_mode: random`` (``jax.random.key(selection_seed)``)."""
    validation_starts: int = 3
    """the validation grid (``splice_validation_set``): in-document starts per document ..."""
    validation_offsets: int = 3
    """... and placements per start; both 0: no validation set."""


@dataclass(frozen=True)
class _SpliceConfig(MeshbatchLMConfig, _SelectionFields, _SpliceFields):
    def __post_init__(self):
        super().__post_init__()
        _checked(self, lambda: self.spec(seq_len=max(2, self.content_length or 2)))  # by name, now
        if (self.validation_starts == 0) != (self.validation_offsets == 0):
            raise ConfigError(
                f"validation_starts={self.validation_starts} and validation_offsets="
                f"{self.validation_offsets}: both 0 (no validation set) or both positive"
            )

    def spec(self, seq_len: int) -> SpliceSpec:
        fields = {name: getattr(self, name) for name in SPLICE_FIELDS}
        if fields["pad_token_id"] is None:
            fields["pad_token_id"] = 0
        return SpliceSpec(seq_len=seq_len, **fields)

    def selected(self, cache: TokenCache, seq_len: int):
        from jax.random import key

        return select_documents(
            cache.doc_lengths(),
            num_docs=self.num_docs,
            doc_index=self.doc_index,
            min_doc_length=self.min_doc_length,
            max_doc_length=self.max_doc_length,
            doc_select_mode=self.doc_select_mode,
            key=key(self.selection_seed),
            restrict_to_training_subset=self.restrict_to_training_subset,
            max_train_batches=self.max_train_batches,
            initial_batch_size=self.initial_batch_size,
            seq_len=seq_len,
        )

    def dataset(self, seq_len: int, split: str = "train") -> SpliceLMDataset:
        cache = self.cache("train")
        selection = self.selected(cache, seq_len)
        spec = dataclasses.asdict(self.spec(seq_len))
        return SpliceLMDataset.from_cache(cache, selection.indices, **spec)

    def validation_sets(self, Pos: Axis, monitors=True) -> Mapping[str, AsyncDataset[LmExample]]:
        """The seed's validation grid: every selected document at a fixed small ``(t, s)`` grid."""
        if self.validation_starts == 0:
            return {}
        cache = self.cache("train")
        docs = cache.read_rows(self.selected(cache, Pos.size).indices)
        spec = dataclasses.asdict(self.spec(Pos.size))
        starts, offsets = self.validation_starts, self.validation_offsets
        with local_cpu_mesh():
            batch = splice_validation_set(docs, starts=starts, offsets=offsets, key=loader_key(0), **spec)
            examples = lm_examples(batch, Pos)
        return {self.component[0]: ListAsyncDataset(examples, is_complete=True)}


@MeshbatchLMConfig.register_subclass("splice_multi_document")
@dataclass(frozen=True)
class SpliceMultiDocumentLMConfig(_SpliceConfig):
    """The seed's ``SpliceMultiDocumentLMConfig``: ``num_docs`` documents of one component,
    selected by length and policy, spliced by the schedule every ``SpliceSpec`` field describes."""


@MeshbatchLMConfig.register_subclass("splice_single_document")
@dataclass(frozen=True)
class SpliceSingleDocumentLMConfig(_SpliceConfig):
    """The seed's ``SpliceSingleDocumentLMConfig``: one document (``doc_index`` if it passes the
    length filters, else ``doc_select_mode``'s pick)."""

    def __post_init__(self):
        if self.num_docs != 1:
            raise ConfigError(f"splice_single_document selects one document (got num_docs={self.num_docs})")
        super().__post_init__()
