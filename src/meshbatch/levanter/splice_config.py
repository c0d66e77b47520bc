"""The splice configs: ``splice_multi_document`` and ``splice_single_document``."""

from __future__ import annotations

import dataclasses
import os
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

import numpy as np
from haliax import Axis
from levanter.data.dataset import AsyncDataset, ListAsyncDataset
from levanter.data.text import TextLmDatasetFormat
from levanter.models.lm_model import LmExample
from levanter.utils.jax_utils import local_cpu_mesh

from meshbatch.cache import TokenCache
from meshbatch.datasets.splice.indexed import splice_validation_set
from meshbatch.datasets.splice.selection import select_documents
from meshbatch.datasets.splice.splice_dataset import SpliceLMDataset
from meshbatch.datasets.splice.splice_spec import SpliceSpec

from .async_datasets import lm_examples, loader_key
from .config import MeshbatchLMConfig
from .fields import default, refuse
from .sources import BaseDataConfig, ConfigError, MixtureBaseConfig, UrlBaseConfig, _checked


def source_type(source) -> str:
    """The single-source type that trains ``source`` (a Levanter source config): ``hf_causal_lm``
    for a Hugging Face ``id:``, else ``causal_lm``."""
    return "hf_causal_lm" if getattr(source, "id", None) is not None else "causal_lm"


SPLICE_FIELDS = tuple(f.name for f in dataclasses.fields(SpliceSpec) if f.name != "seq_len")


# The specification's config-class defaults where they differ from SpliceSpec's (its dataset
# sketch reads balance_mode by_coverage; a YAML meets the config class; docs/splice.md).
SEED_DEFAULTS = {"content_start_mode": "coverage_balanced", "balance_mode": "by_temperature"}

# Every SpliceSpec field but seq_len (the model's), with its type and default: draccus parses
# them from YAML and the checks stay SpliceSpec's own.
_SpliceFields = dataclasses.make_dataclass(
    "_SpliceFields",
    [
        (
            f.name,
            typing.get_type_hints(SpliceSpec)[f.name],
            dataclasses.field(default=SEED_DEFAULTS.get(f.name, f.default)),
        )
        for f in dataclasses.fields(SpliceSpec)
        if f.name in SPLICE_FIELDS
    ],
    frozen=True,
)
_SpliceFields.__module__ = __name__
_SpliceFields.__doc__ = "Every ``SpliceSpec`` field (``docs/splice.md``), with the config class's defaults."


@dataclass(frozen=True)
class _SelectionFields:
    """The document selection (``meshbatch.select_documents``)."""

    num_docs: int = 10
    doc_index: int | None = None
    min_doc_length: int | None = None
    max_doc_length: int | None = None
    doc_select_mode: Literal["first", "longest", "shortest", "random"] = "longest"
    restrict_to_training_subset: bool = False
    max_train_batches: int | None = None
    """the training subset's batches; ``None``: base's ``max_train_batches[dataset_name]`` (a
    mixture base, Levanter's field), else the whole cache is the training subset. It, base's and
    ``initial_batch_size`` need ``restrict_to_training_subset: true`` (refused by name without)."""
    doc_key: str | None = None
    """keep documents whose decoded text contains it (decodes every document of the cache)."""
    initial_batch_size: int | None = None
    selection_seed: int = 0
    """seeds ``doc_select_mode: random`` (``jax.random.key(selection_seed)``)."""
    validation_starts: int = 3
    """the validation grid (``splice_validation_set``): in-document starts per document ..."""
    validation_offsets: int = 3
    """... and placements per start; both 0: no validation set."""


@dataclass(frozen=True)
class _SpliceConfig(MeshbatchLMConfig, _SelectionFields, _SpliceFields):
    """Levanter's ``LMTaskConfig`` fields (the tokenizer), ``base`` (Levanter's single-dataset or
    mixture config: the text) and ``dataset_name`` (the component read)."""

    base: BaseDataConfig = field(default_factory=UrlBaseConfig)
    dataset_name: str | None = None

    def __post_init__(self):
        MeshbatchLMConfig.__post_init__(self)
        refuse(self, "splice")
        refuse(self.base, "splice base")
        self._check_base()
        self._check_selection()
        _checked(self, lambda: self.spec(seq_len=max(2, self.content_length or 2)))  # by name, now
        if (self.validation_starts == 0) != (self.validation_offsets == 0):
            raise ConfigError(
                f"validation_starts={self.validation_starts} and validation_offsets="
                f"{self.validation_offsets}: both 0 (no validation set) or both positive"
            )

    def _check_base(self) -> None:
        names = sorted(self.base.components())
        if isinstance(self.base, MixtureBaseConfig):
            if self.dataset_name is None and len(names) > 1:
                raise ConfigError(f"base has components {names}: choose one with dataset_name")
            if self.dataset_name not in (None, *names):
                raise ConfigError(f"dataset_name={self.dataset_name!r} is not a component of base: {names}")
            weights = [w.get(self.component[0]) for _, w in self.base.stages()]
            if any(w is not None and w <= 0 for w in weights):
                raise ConfigError(
                    f"train_weights gives dataset_name={self.component[0]!r} no weight: nothing to read"
                )
        if self.base.tokenizer not in ("gpt2", self.tokenizer):
            raise ConfigError(
                f"base.tokenizer={self.base.tokenizer!r} differs from tokenizer={self.tokenizer!r}: "
                "the model's tokenizer is the top-level one; set both alike"
            )
        for name in ("vocab_size", "enforce_eos", "cache_options"):  # the cache is built with ours
            value, mine = getattr(self.base, name), getattr(self, name)
            if value not in (default(self.base, name), mine):
                raise ConfigError(
                    f"base.{name}={value!r} differs from {name}={mine!r}: a splice config builds its cache "
                    f"with the top-level {name}; set it there (or both alike)"
                )
        per_epoch = getattr(self.base, "shuffle_per_epoch", None)
        if per_epoch is not None and per_epoch != self.shuffle_per_epoch:
            raise ConfigError(
                f"base.shuffle_per_epoch={per_epoch} differs from shuffle_per_epoch="
                f"{self.shuffle_per_epoch}: the schedule's row shuffle is the top-level one; set both alike"
            )
        name, source, _ = self.component
        where = "base" if isinstance(self.base, UrlBaseConfig) else f"base.configs[{name!r}]"
        if not isinstance(source.format, TextLmDatasetFormat):
            raise ConfigError(
                f"{where}.format={source.format!r}: a splice config splices text documents (a chat/"
                "supervised format's masks would be dropped); use a text format, or train it with type: "
                f"{source_type(source)}"
            )
        for field_name in ("validation_urls", "tags"):
            if getattr(source, field_name, None):
                raise ConfigError(
                    f"{where}.{field_name}={getattr(source, field_name)!r}: a splice config's "
                    "validation set is the splice validation grid over its documents "
                    "(validation_starts / validation_offsets)"
                )

    def _check_selection(self) -> None:
        """The training-subset fields apply only with ``restrict_to_training_subset``."""
        base_batches = getattr(self.base, "max_train_batches", None)
        bounds = {"max_train_batches": self.max_train_batches, "initial_batch_size": self.initial_batch_size,
                  "base.max_train_batches": base_batches}  # fmt: skip
        for name, value in bounds.items():
            if value is not None and not self.restrict_to_training_subset:
                raise ConfigError(
                    f"{name}={value!r} bounds the training subset: set restrict_to_training_subset: true "
                    "(or drop it)"
                )
        batches = self.train_batches
        if batches is not None and self.initial_batch_size is None:
            raise ConfigError(
                f"restrict_to_training_subset with max_train_batches={batches} needs initial_batch_size "
                "(the subset is max_train_batches * initial_batch_size * seq_len tokens)"
            )

    def cache_dirs(self) -> dict[str, str | None]:
        """The cache directory of the component read (checked at parse time)."""
        components = self.base.components()
        if isinstance(self.base, UrlBaseConfig):
            return {"base.cache_dir=None": self.base.cache_dir}
        names = list(components)
        name = self.dataset_name if self.dataset_name is not None or len(names) != 1 else names[0]
        if name not in components:
            return {}  # _check_base names it
        return {f"base.configs[{name!r}].cache_dir=None with base.cache_dir=None": components[name][1]}

    @property
    def component(self) -> tuple[str, object, str | None]:
        """``(name, source, cache_dir)`` read: ``dataset_name``'s component of a mixture base (or
        its only one), or a single-dataset base, which ``dataset_name`` names when given."""
        components = self.base.components()
        if isinstance(self.base, UrlBaseConfig) or self.dataset_name is None:
            (name, (source, cache_dir)), *_ = components.items()
            return self.dataset_name or name, source, cache_dir
        return (self.dataset_name, *components[self.dataset_name])

    @property
    def train_batches(self) -> int | None:
        """The training subset's batches: ``max_train_batches``, else a mixture base's
        ``max_train_batches[dataset_name]``."""
        if self.max_train_batches is not None:
            return self.max_train_batches
        return (getattr(self.base, "max_train_batches", None) or {}).get(self.component[0])

    @property
    def sources(self) -> Mapping[str, object]:
        name, source, _ = self.component
        return {name: source}

    def cache(self, split: str = "train") -> TokenCache | None:
        _, source, cache_dir = self.component
        path = self.build_split(source, split, cache_dir)
        return None if path is None else TokenCache.open(path)

    def build_caches(self, split: str, monitors=True) -> Mapping[str, TokenCache]:
        cache = self.cache(split)
        return {} if cache is None else {self.component[0]: cache}

    def train_set(self, Pos: Axis, batch_schedule=None, monitors=True, *, key, epochs: int | None = None):
        dataset = self.dataset(Pos.size)
        name, _, cache_dir = self.component
        path = os.path.join(str(cache_dir), "train")
        kind = type(self).__name__
        sources = {name: dataset.sources[0]} if dataset.sources else {}  # documents read up front: none
        selection = {f.name: getattr(self, f.name) for f in dataclasses.fields(_SelectionFields)}
        record = {"config": kind, "component": name, "splice": {f: getattr(self, f) for f in SPLICE_FIELDS},
                  "selection": selection}  # fmt: skip
        return self.announce(kind, record, {name: path}, dataset, sources, Pos=Pos, key=key, epochs=epochs)

    def train_sets(self, Pos: Axis, monitors=True, *, key, epochs: int | None = None):
        return {self.component[0]: self.train_set(Pos, None, monitors, key=key, epochs=epochs)}

    def spec(self, seq_len: int) -> SpliceSpec:
        fields = {name: getattr(self, name) for name in SPLICE_FIELDS}
        if fields["pad_token_id"] is None:
            fields["pad_token_id"] = 0
        return SpliceSpec(seq_len=seq_len, **fields)

    def selected(self, cache: TokenCache, seq_len: int):
        from jax.random import key

        batches = self.train_batches
        restrict = self.restrict_to_training_subset and batches is not None  # else: the whole cache
        keys = {}
        if self.doc_key is not None:
            texts = [self.the_tokenizer.decode(doc) for doc in cache.read_rows(np.arange(cache.num_rows))]
            keys = {"doc_key": lambda text: self.doc_key in text, "doc_keys": texts}
        return select_documents(
            cache.doc_lengths(),
            num_docs=self.num_docs,
            doc_index=self.doc_index,
            min_doc_length=self.min_doc_length,
            max_doc_length=self.max_doc_length,
            doc_select_mode=self.doc_select_mode,
            key=key(self.selection_seed),
            restrict_to_training_subset=restrict,
            max_train_batches=batches if restrict else None,
            initial_batch_size=self.initial_batch_size if restrict else None,
            seq_len=seq_len,
            **keys,
        )

    def dataset(self, seq_len: int, split: str = "train") -> SpliceLMDataset:
        cache = self.cache("train")
        selection = self.selected(cache, seq_len)
        spec = dataclasses.asdict(self.spec(seq_len))
        return SpliceLMDataset.from_cache(cache, selection.indices, **spec)

    def validation_sets(self, Pos: Axis, monitors=True) -> Mapping[str, AsyncDataset[LmExample]]:
        """The splice validation grid: every selected document at a fixed small ``(t, s)`` grid."""
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
    """``num_docs`` documents of one component, selected by length and policy, spliced by the
    schedule every ``SpliceSpec`` field describes."""


@MeshbatchLMConfig.register_subclass("splice_single_document")
@dataclass(frozen=True)
class SpliceSingleDocumentLMConfig(_SpliceConfig):
    """One document (``doc_index`` if it passes the length filters, else ``doc_select_mode``'s pick)."""

    num_docs: int = 1

    def __post_init__(self):
        if self.num_docs != 1:
            raise ConfigError(f"splice_single_document selects one document (got num_docs={self.num_docs})")
        super().__post_init__()
