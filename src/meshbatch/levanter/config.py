"""Levanter data configs for meshbatch datasets, parsed by draccus from ``data:`` in a YAML file.

Each is an ``LMTaskConfig`` (``the_tokenizer``, ``train_set``, ``validation_sets``,
``tagged_eval_sets``, ``build_caches``, ``sources``) and a draccus choice named by ``type:``:

    data:
      type: splice_multi_document          # or splice_single_document, causal_lm
      tokenizer: byte_tokenizer            # a local Hugging Face tokenizer directory (no download)
      base:
        type: url_single_dataset           # or mixture (configs + train_weights), as the seed writes
        cache_dir: cache/corpus            # built here from train_urls by meshbatch on first use
        train_urls: [data/train.jsonl]
      num_docs: 4
      content_start_mode: coverage_balanced

``python -m meshbatch.levanter.train_lm --config_path cfg.yaml`` runs Levanter's ``train_lm`` with
these types accepted (``TrainLmConfig`` below); everything else in the YAML is Levanter's own.
Caches are built offline by meshbatch from local text with the tokenizer directory's
``tokenizer.json`` (``ByteTokenizer().save_pretrained(dir)`` writes one for bytes), so Levanter's
tokenizer and the cache agree. A wrong field name, an unknown ``type:`` or a value outside a
``Literal`` fails at parse time naming the field; contradictory values fail in ``__post_init__``.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

import draccus
from draccus.utils import ParsingError
from haliax import Axis
from levanter.data.dataset import AsyncDataset, ListAsyncDataset
from levanter.data.text import LMTaskConfig
from levanter.models.lm_model import LmExample
from levanter.utils.jax_utils import local_cpu_mesh

from ..cache import HFTokenizer, TokenCache, build_cache
from ..datasets.causal import CausalLMDataset
from ..datasets.splice import SpliceLMDataset
from ..datasets.splice_indexed import splice_validation_set
from ..mixtures import Mixture, TokenBalancedMixture
from ..select import select_documents
from ..shuffle import ShuffleSpec
from ..splice.spec import SpliceSpec
from .datasets import MeshbatchDataset, lm_examples, loader_key

__all__ = [
    "BaseDataConfig",
    "CausalLMConfig",
    "ConfigError",
    "MeshbatchLMConfig",
    "MixtureBaseConfig",
    "SourceConfig",
    "SpliceMultiDocumentLMConfig",
    "SpliceSingleDocumentLMConfig",
    "StableMixtureLMConfig",
    "TextFormat",
    "TokenBalancedMixtureLMConfig",
    "UrlBaseConfig",
]


class ConfigError(ParsingError):
    """A data config whose values contradict each other (raised from ``__post_init__``).

    Not a ``ValueError``: draccus replaces the message of a ``ValueError`` raised while it builds
    a dataclass with "Couldn't instantiate class ...", and a YAML user must see which field."""


def _checked(config, check) -> None:
    """Runs ``check()``, turning a ``TypeError``/``ValueError`` into a ``ConfigError`` naming ``config``."""
    try:
        check()
    except (TypeError, ValueError) as error:
        raise ConfigError(f"{type(config).__name__}: {error}") from error


@dataclass(frozen=True)
class TextFormat:
    """Where a JSONL line keeps its text (Levanter's ``format: {text_key: ...}``)."""

    text_key: str = "text"


@dataclass(frozen=True)
class SourceConfig:
    """One text source: a meshbatch/Levanter token cache under ``cache_dir``, one per split
    (``cache_dir/train``, ``cache_dir/validation``), built from local ``.txt``/``.jsonl`` files
    on first use (resumed if a build was interrupted; a finished cache is reused as is)."""

    cache_dir: str | None = None
    train_urls: list[str] = field(default_factory=list)
    validation_urls: list[str] = field(default_factory=list)
    format: TextFormat = field(default_factory=TextFormat)
    tags: list[str] | None = None

    def cache(self, split: str, tokenizer_dir: str, *, name: str) -> TokenCache | None:
        """The finished cache of ``split`` (``None`` without files for it)."""
        urls = {"train": self.train_urls, "validation": self.validation_urls}[split]
        if self.cache_dir is None:
            raise ValueError(f"source {name!r} needs cache_dir (where its {split} cache lives)")
        path = os.path.join(self.cache_dir, split)
        if urls:
            tokenizer = HFTokenizer(os.path.join(tokenizer_dir, "tokenizer.json"))
            build_cache(path, list(urls), tokenizer=tokenizer, text_key=self.format.text_key, progress=False)
        elif not os.path.isdir(path):
            return None
        return TokenCache.open(path)


@dataclass(frozen=True)
class BaseDataConfig(draccus.ChoiceRegistry):
    """The seed's ``base:``: the text the documents or windows come from."""

    tokenizer: str | None = None

    @classmethod
    def default_choice_name(cls) -> str | None:
        return "url_single_dataset"

    def components(self) -> dict[str, SourceConfig]:
        raise NotImplementedError


@BaseDataConfig.register_subclass("url_single_dataset")
@dataclass(frozen=True)
class UrlBaseConfig(BaseDataConfig, SourceConfig):
    """One source (Levanter's ``UrlSingleDatasetLMConfig`` fields we use); its name is ``name``."""

    name: str = "default"

    def components(self) -> dict[str, SourceConfig]:
        return {self.name: self}


@BaseDataConfig.register_subclass("mixture")
@dataclass(frozen=True)
class MixtureBaseConfig(BaseDataConfig):
    """Several named sources (Levanter's ``LMMixtureDatasetConfig`` fields we use); a splice
    config reads one of them, ``dataset_name``. Weights and shuffles are parsed as Levanter's and
    kept for the record: a splice dataset draws from one component only."""

    configs: dict[str, SourceConfig] = field(default_factory=dict)
    train_weights: dict[str, float] | list[tuple[int, dict[str, float]]] = field(default_factory=dict)
    """a weight per component, or staged weights ``[[start_step, {name: weight}], ...]``."""
    shuffle: bool | int = False
    shuffle_per_epoch: bool = True

    def stages(self) -> list[tuple[int, dict[str, float]]]:
        """``train_weights`` as ``(start_step, weights)`` stages."""
        if isinstance(self.train_weights, Mapping):
            return [(0, dict(self.train_weights))]
        return [(int(start), dict(weights)) for start, weights in self.train_weights]

    def __post_init__(self):
        unknown = sorted({name for _, weights in self.stages() for name in weights} - set(self.configs))
        if unknown:
            raise ConfigError(f"train_weights names {unknown} missing from configs {sorted(self.configs)}")

    def components(self) -> dict[str, SourceConfig]:
        return dict(self.configs)


@dataclass(frozen=True)
class MeshbatchLMConfig(LMTaskConfig, draccus.ChoiceRegistry):
    """What every meshbatch data config shares: a ``base`` of text, the component it reads
    (``dataset_name``; the only one when ``None``), and Levanter's ``LMTaskConfig`` fields
    (``tokenizer`` must be a local directory, or left unset to use ``base.tokenizer``)."""

    base: BaseDataConfig = field(default_factory=UrlBaseConfig)
    dataset_name: str | None = None
    fast_path: bool = True
    """feed training through ``meshbatch.Pipeline`` (same batches as Levanter's ``DataLoader``)."""

    def __post_init__(self):
        self._check_base()
        if self.tokenizer == "passthrough":
            raise ConfigError("tokenizer='passthrough' cannot build caches: name a local tokenizer directory")

    def _check_base(self) -> None:
        names = sorted(self.base.components())
        if not isinstance(self.base, UrlBaseConfig) and self.dataset_name is None and len(names) > 1:
            raise ConfigError(f"base has components {names}: choose one with dataset_name")
        if not isinstance(self.base, UrlBaseConfig) and self.dataset_name not in (None, *names):
            raise ConfigError(f"dataset_name={self.dataset_name!r} is not a component of base: {names}")
        if not names:
            raise ConfigError("base has no components: give base.configs (mixture) or base.cache_dir")

    @property
    def tokenizer_dir(self) -> str:
        """The local tokenizer directory caches are built with (``tokenizer``, else ``base.tokenizer``)."""
        path = self.base.tokenizer if self.tokenizer == "gpt2" and self.base.tokenizer else self.tokenizer
        if not os.path.isfile(os.path.join(path, "tokenizer.json")):
            raise FileNotFoundError(
                f"tokenizer={path!r} must be a local directory with a tokenizer.json (meshbatch never "
                "downloads one; ByteTokenizer().save_pretrained(dir) writes a byte tokenizer)"
            )
        return path

    @property
    def component(self) -> tuple[str, SourceConfig]:
        """``(name, source)`` read: ``dataset_name``'s component of a mixture base (or its only
        one), or a single-dataset base, which ``dataset_name`` names when given (the seed sets
        it over a single-dataset base too)."""
        components = self.base.components()
        if isinstance(self.base, UrlBaseConfig) or self.dataset_name is None:
            (name, source), *_ = components.items()
            return self.dataset_name or name, source
        return self.dataset_name, components[self.dataset_name]

    @property
    def sources(self) -> Mapping[str, SourceConfig]:
        name, source = self.component
        return {name: source}

    def cache(self, split: str = "train") -> TokenCache | None:
        name, source = self.component
        return source.cache(split, self.tokenizer_dir, name=name)

    def build_caches(self, split: str, monitors=True) -> Mapping[str, TokenCache]:
        """meshbatch ``TokenCache``s (Levanter-format on disk) of ``split``, built if needed."""
        cache = self.cache(split)
        return {} if cache is None else {self.component[0]: cache}

    def dataset(self, seq_len: int, split: str = "train"):
        """The meshbatch ``Dataset`` this config describes."""
        raise NotImplementedError

    def train_set(self, Pos: Axis, batch_schedule=None, monitors=True, *, key, epochs: int | None = None):
        return MeshbatchDataset(
            self.dataset(Pos.size), Pos=Pos, key=key, epochs=epochs, fast_path=self.fast_path
        )

    def train_sets(self, Pos: Axis, monitors=True, *, key, epochs: int | None = None):
        return {self.component[0]: self.train_set(Pos, None, monitors, key=key, epochs=epochs)}

    def validation_sets(self, Pos: Axis, monitors=True) -> Mapping[str, AsyncDataset[LmExample]]:
        return {}


SPLICE_FIELDS = tuple(f.name for f in dataclasses.fields(SpliceSpec) if f.name != "seq_len")


@dataclass(frozen=True)
class _SpliceFields:
    """Every ``SpliceSpec`` field (``docs/splice.md``), with the seed's names and defaults."""

    content_length: int | None = None
    content_stride: int = 1
    offset_stride: int = 1
    window_stride: int = 1
    content_start_mode: Literal["anchor_start", "slide_within", "cyclic_roll", "coverage_balanced"] = (
        "anchor_start"
    )
    mode: Literal["splice", "slide"] = "splice"
    min_copy_len: int = 2
    alpha: float = 0.0
    adaptive_k: bool = True
    offset_jitter: int = 0
    jitter_mode: Literal["uniform", "hash"] = "uniform"
    balance_mode: Literal["by_coverage", "by_document", "by_length", "by_temperature"] = "by_coverage"
    balance_tau: float = 1.0
    epoch_length: int | None = None
    shuffle_per_epoch: bool = False
    shuffle_content: bool = False
    shuffle_offsets: bool = False
    pad_token_id: int | None = None
    eos_token_id: int | None = None
    segment_mode: Literal["prefix", "document"] = "prefix"


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


@MeshbatchLMConfig.register_subclass("causal_lm")
@dataclass(frozen=True)
class CausalLMConfig(MeshbatchLMConfig):
    """Levanter's causal-LM windows over a token cache with meshbatch's shuffles and coalesced
    reads: ``seq_len``-token windows of the concatenated documents (``TokenSeqDataset``), loss on
    every next token, segments split at ``eos_id`` when given (``CausalLmDataset``).

    ``shuffle``: ``none``, ``full`` (a permutation of all windows), ``era`` (``era_length``
    windows at a time, usable while a cache is written) or ``block`` (``io_block_size`` windows
    read together, ``window_blocks`` blocks mixed: the blockwise shuffle).
    """

    shuffle: Literal["none", "full", "era", "block"] = "block"  # type: ignore[assignment]
    permutation_type: Literal["feistel", "linear"] = "feistel"  # type: ignore[assignment]
    compat: Literal["levanter"] | None = None
    era_length: int | None = None
    io_block_size: int | None = None
    window_blocks: int = 8
    reshuffle_each_epoch: bool = False
    eos_id: int | None = None

    def __post_init__(self):
        super().__post_init__()
        _checked(self, self.shuffle_spec)  # contradictory fields fail now, by name

    def shuffle_spec(self) -> ShuffleSpec:
        block = self.shuffle == "block"
        return ShuffleSpec(
            self.shuffle,
            **({} if self.shuffle == "none" else {"kind": self.permutation_type, "compat": self.compat}),
            era_length=self.era_length,
            **({"io_block_size": self.io_block_size, "window_blocks": self.window_blocks} if block else {}),
            **({"reshuffle_each_epoch": self.reshuffle_each_epoch} if self.shuffle != "none" else {}),
        )

    def dataset(self, seq_len: int, split: str = "train") -> CausalLMDataset:
        cache = self.cache(split)
        if cache is None:
            raise ValueError(f"no {split} files or cache for {self.component[0]!r}")
        return CausalLMDataset(cache, seq_len, shuffle=self.shuffle_spec(), eos_id=self.eos_id)

    def validation_sets(self, Pos: Axis, monitors=True) -> Mapping[str, AsyncDataset[LmExample]]:
        cache = self.cache("validation")
        if cache is None:
            return {}
        dataset = CausalLMDataset(cache, Pos.size, shuffle=ShuffleSpec("none"), eos_id=self.eos_id)
        return {self.component[0]: MeshbatchDataset(dataset, Pos=Pos, key=0, epochs=1)}


@dataclass(frozen=True)
class _MixtureConfig(CausalLMConfig):
    """Causal-LM windows of every component of a ``type: mixture`` base, mixed; the window and
    shuffle fields are ``causal_lm``'s and apply to every component."""

    base: BaseDataConfig = field(default_factory=MixtureBaseConfig)

    def _check_base(self) -> None:
        if not isinstance(self.base, MixtureBaseConfig):
            raise ConfigError(f"{type(self).__name__} mixes the components of a `base: {{type: mixture}}`")
        if self.dataset_name is not None:
            raise ConfigError(f"dataset_name={self.dataset_name!r}: a mixture reads every component")
        if not self.base.configs:
            raise ConfigError("base has no components: give base.configs")

    @property
    def sources(self) -> Mapping[str, SourceConfig]:
        return self.base.components()

    def build_caches(self, split: str, monitors=True) -> Mapping[str, TokenCache]:
        caches = {
            name: source.cache(split, self.tokenizer_dir, name=name) for name, source in self.sources.items()
        }
        return {name: cache for name, cache in caches.items() if cache is not None}

    def children(self, seq_len: int, split: str = "train") -> dict[str, CausalLMDataset]:
        shuffle = self.shuffle_spec() if split == "train" else ShuffleSpec("none")
        return {
            name: CausalLMDataset(cache, seq_len, shuffle=shuffle, eos_id=self.eos_id)
            for name, cache in self.build_caches(split).items()
        }

    def train_sets(self, Pos: Axis, monitors=True, *, key, epochs: int | None = None):
        return {"mixture": self.train_set(Pos, None, monitors, key=key, epochs=epochs)}

    def validation_sets(self, Pos: Axis, monitors=True) -> Mapping[str, AsyncDataset[LmExample]]:
        """Each component's validation windows, an eval set per component (tagged by name)."""
        return {
            name: MeshbatchDataset(dataset, Pos=Pos, key=0, epochs=1)
            for name, dataset in self.children(Pos.size, "validation").items()
        }


@MeshbatchLMConfig.register_subclass("stable_mixture")
@dataclass(frozen=True)
class StableMixtureLMConfig(_MixtureConfig):
    """Levanter's stable mixture (``meshbatch.Mixture``): ``train_weights`` (or staged weights)
    of ``base``, ``mixture_block_size`` rows a block, ``stop_strategy``; ``mixture_compat:
    levanter`` gives the installed Levanter's ``MixtureDataset`` rows."""

    mixture_block_size: int = 2048
    stop_strategy: Literal["restart", "first_exhausted", "all_exhausted"] = "restart"
    mixture_compat: Literal["levanter"] | None = None

    def mixture(self, seq_len: int, batch_size=None) -> Mixture:
        stages = self.base.stages()
        weights = stages[0][1] if len(stages) == 1 and stages[0][0] == 0 else stages
        return Mixture(
            self.children(seq_len),
            weights,
            block_size=self.mixture_block_size,
            stop_strategy=self.stop_strategy,
            compat=self.mixture_compat,
            batch_size=batch_size,
        )

    def dataset(self, seq_len: int, split: str = "train") -> Mixture:
        return self.mixture(seq_len)

    def train_set(self, Pos: Axis, batch_schedule=None, monitors=True, *, key, epochs: int | None = None):
        batch_size = getattr(batch_schedule, "schedule", batch_schedule)
        dataset = self.mixture(Pos.size, batch_size)
        return MeshbatchDataset(dataset, Pos=Pos, key=key, epochs=epochs, fast_path=self.fast_path)


@MeshbatchLMConfig.register_subclass("token_balanced_mixture")
@dataclass(frozen=True)
class TokenBalancedMixtureLMConfig(_MixtureConfig):
    """The token-balanced least-consumed interleave (``meshbatch.TokenBalancedMixture``) of
    ``base``'s components (weights do not apply). It is sequential, so it trains on the fast path
    only; a resumed run replays its plans from step 0 (host planning only, no reads) to rebuild
    the per-source counts exactly."""

    baseline: Literal["zero", "min", "mean"] = "zero"

    def __post_init__(self):
        super().__post_init__()
        if not self.fast_path:
            raise ConfigError("token_balanced_mixture is sequential: it needs fast_path: true")

    def dataset(self, seq_len: int, split: str = "train") -> TokenBalancedMixture:
        return TokenBalancedMixture(self.children(seq_len), baseline=self.baseline)
