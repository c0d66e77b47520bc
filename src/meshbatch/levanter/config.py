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

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

import draccus
from haliax import Axis
from levanter.data.dataset import AsyncDataset
from levanter.data.text import LMTaskConfig
from levanter.models.lm_model import LmExample

from meshbatch.cache import TokenCache
from meshbatch.datasets.causal import GROWING_ORDERS, CausalLMDataset
from meshbatch.shuffles.shuffle_spec import ShuffleSpec

from .async_datasets import MeshbatchDataset
from .sources import BaseDataConfig, ConfigError, SourceConfig, UrlBaseConfig, _checked


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
    quick_start: bool = False
    """train while the train cache is still built (in a background thread): batches hold only
    committed windows and wait for more; needs ``shuffle: era`` or ``none`` and the fast path."""

    def __post_init__(self):
        super().__post_init__()
        _checked(self, self.shuffle_spec)  # contradictory fields fail now, by name
        if self.quick_start and self.shuffle not in GROWING_ORDERS:
            raise ConfigError(
                f"quick_start=true with shuffle={self.shuffle!r}: a {self.shuffle} shuffle needs the "
                "cache's final length; use shuffle: era (or none) to train while it is written"
            )
        if self.quick_start and not self.fast_path:
            raise ConfigError(
                "quick_start=true needs fast_path=true (Levanter's DataLoader needs a final length)"
            )

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
        if self.quick_start and split == "train":
            name, source = self.component
            cache = source.growing_cache(self.tokenizer_dir, name=name)
        else:
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
