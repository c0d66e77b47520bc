"""Levanter data configs for meshbatch datasets: Levanter's own config classes, extended.

A meshbatch config *is* Levanter's: ``causal_lm`` subclasses ``UrlSingleDatasetLMConfig``,
``hf_causal_lm`` ``HfSingleDatasetLMConfig``, ``stable_mixture`` / ``token_balanced_mixture``
subclass ``LMMixtureDatasetConfig`` and the splice configs take a ``base:`` (a URL
config or a mixture). So a Levanter ``data:`` block trains with meshbatch after adding one
``type:`` line, with Levanter's fields, defaults and meanings
(``shuffle: false`` keeps cache order, ``true`` a full permutation, ``n`` an era shuffle of
``n``) and Levanter's orders (``compat: levanter``, ``mixture_compat: levanter``: the defaults),
so the batches are Levanter's; meshbatch's orders (``compat: strong``, ``mixture_compat: exact``,
block shuffle, splice, token balancing) are opt-in fields. The Python API keeps its own
defaults (``ShuffleSpec(compat=None)``, ``Mixture(compat=None)``). Levanter's machinery builds
the caches (``caches.py``); meshbatch replaces what ``train_set`` and the validation sets return.
Every Levanter field is honoured or refused at parse time (``fields.py``).

    data:
      type: causal_lm                      # the one added line
      tokenizer: gpt2                      # Levanter's tokenizer loading (hub name, local dir)
      cache_dir: cache/owt
      train_urls: ["owt/train.{1..8}-of-8.jsonl.gz"]
      validation_urls: ["owt/val.{1..2}-of-2.jsonl.gz"]
"""

import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

import draccus
from haliax import Axis
from levanter.data.dataset import AsyncDataset
from levanter.data.text import (
    ChatLmDatasetFormat,
    HfSingleDatasetLMConfig,
    LMTaskConfig,
    TextLmDatasetFormat,
    UrlSingleDatasetLMConfig,
)
from levanter.models.lm_model import LmExample

from meshbatch.cache import TokenCache
from meshbatch.datasets.causal import GROWING_ORDERS, CausalLMDataset
from meshbatch.datasets.packed import PackedDataset
from meshbatch.datasets.provenance import content_fingerprint
from meshbatch.shuffles.shuffle_spec import ShuffleSpec

from . import order
from .async_datasets import MeshbatchDataset
from .caches import build_split
from .fields import refuse
from .observe import FAST, LEVANTER_LOADER, StepMetrics, start
from .sources import ConfigError, _checked

logger = logging.getLogger(__name__)
ShuffleField = bool | int | Literal["none", "full", "era", "block"]


@dataclass(frozen=True)
class MeshbatchLMConfig(LMTaskConfig, draccus.ChoiceRegistry):
    """What every meshbatch data config adds to Levanter's ``LMTaskConfig``."""

    fast_path: bool = True
    """feed training through ``meshbatch.Pipeline`` (same batches as Levanter's ``DataLoader``)."""
    cache_builder: Literal["in_process", "ray"] = "in_process"
    """how Levanter's machinery builds a missing cache (``caches.py``)."""
    eos_id: int | None = None
    """segments split after it; ``None``: the tokenizer's ``eos_token_id`` (Levanter's)."""
    metrics_every: int = 10
    """log per-source consumption, reads per example and data wait every this many steps (0: never)."""

    def build_split(self, source, split: str, cache_dir: str | None) -> str | None:
        """``cache_dir/split`` of ``source`` (``cache_dirs``: set, checked at parse time), built by
        Levanter's machinery if missing."""
        return build_split(
            source, split, cache_dir=cache_dir, tokenizer=self.the_tokenizer, enforce_eos=self.enforce_eos,
            options=self.cache_options, builder=self.cache_builder, chat_template=self.chat_template,
        )  # fmt: skip

    @property
    def eos(self) -> int | None:
        return self.eos_id if self.eos_id is not None else self.the_tokenizer.eos_token_id

    @property
    def ignore(self) -> int | None:
        ignore = self.ignore_token_id
        return None if ignore is None or ignore < 0 else ignore  # a negative id matches no token

    def announce(
        self, kind: str, record: dict, caches: Mapping[str, str], dataset, sources, *, Pos, key, epochs
    ):
        """``dataset`` as the train set (a ``MeshbatchDataset``), with its start line and summary
        (``observe.start``) in the data order ``record`` (``order.py``; its ``data_key`` is
        ``key``'s), which the next checkpoints record and a resume is checked against, and the
        per-step metrics of ``sources`` (name -> ``TokenCache``)."""
        train = MeshbatchDataset(dataset, Pos=Pos, key=key, epochs=epochs, fast_path=self.fast_path)
        record = {**record, "data_key": order.key_hex(key)}
        # what Pipeline.content_fingerprint() gives for this dataset and key (its host half)
        fingerprint = content_fingerprint(train.host)
        if self.fast_path:
            loader, why = FAST, "meshbatch.Pipeline builds each global batch on the devices (PipelineLoader)"
        else:
            loader, why = LEVANTER_LOADER, "fast_path: false"
        start(
            kind,
            record,
            loader=loader,
            why=why,
            builder=self.cache_builder,
            caches=caches,
            fingerprint=fingerprint,
        )
        if sources:
            train.metrics = StepMetrics(sources, every=self.metrics_every)
        from .fast import note  # fast imports Levanter's trainer: only when training

        note(record, fingerprint, train=train)
        return train

    def rows(self, fmt, path: str, seq_len: int, shuffle: ShuffleSpec) -> CausalLMDataset | PackedDataset:
        """The split cached at ``path`` in the order ``shuffle``: ``CausalLMDataset`` windows of a
        text ``fmt``, a chat or supervised one's ``packed_dataset`` rows."""
        if isinstance(fmt, TextLmDatasetFormat):
            cache = TokenCache.open(path)
            return CausalLMDataset(cache, seq_len, shuffle=shuffle, eos_id=self.eos, ignore_id=self.ignore)
        return packed_dataset(fmt, path, seq_len, shuffle)

    def cache_dirs(self) -> dict[str, str | None]:
        """Each source's cache directory, keyed by the fields that set it (checked at parse time):
        ``cache_dir``, or a mixture component's ``configs[name].cache_dir`` (else ``cache_dir/name``)."""
        components = getattr(self, "components", None)
        if components is None:
            return {"cache_dir=None": self.cache_dir}
        return {
            f"configs[{name!r}].cache_dir=None with cache_dir=None": path
            for name, (_, path) in components().items()
        }

    def __post_init__(self):
        if self.tokenizer == "passthrough" and self.vocab_size is None:
            raise ConfigError("tokenizer='passthrough' needs vocab_size (Levanter's PassthroughTokenizer)")
        if self.metrics_every < 0:
            raise ConfigError(f"metrics_every must be >= 0 (got metrics_every={self.metrics_every})")
        if self.eos_id is not None and self.eos_id < 0:
            raise ConfigError(f"eos_id must be a token id >= 0 or unset (got eos_id={self.eos_id})")
        for fields, path in self.cache_dirs().items():
            if path is None:
                raise ConfigError(f"{fields}: no directory to build and find the cache in; set one")


def packed_dataset(fmt, path: str, seq_len: int, shuffle: ShuffleSpec) -> PackedDataset:
    """The packed examples of the chat or supervised cache at ``path`` in Levanter's packing
    (``compat="levanter"``: ``GreedyPrepackedDataset``'s rows and Levanter's loss masks, at most 64
    examples a row), its rows in the order ``shuffle``: the fast path's equal of Levanter's packed
    dataset shuffled as Levanter shuffles it. As Levanter's ``dataset_for_format``, multi-turn chat
    is ``MultiturnChatDataset`` (``assistant_masks``), single-turn chat and supervised are
    ``SupervisedDataset`` (``sources_len``), as ``order.packed_order`` names them; ``pack: false``
    is one example a row (Levanter's ``max_segments_per_example=1``); ``mask_user_turns`` /
    ``mask_inputs`` is ``mask_prompt``; Levanter's slicing of long examples."""
    packing = order.packed_order(fmt)
    if not packing:
        raise ConfigError(f"format={fmt!r} is not a chat or supervised format: no packed examples")
    packing["mask_prompt"] = fmt.mask_user_turns if isinstance(fmt, ChatLmDatasetFormat) else fmt.mask_inputs
    return PackedDataset(path, seq_len, compat="levanter", max_segments=64, shuffle=shuffle, **packing)


def source_cache(dataset) -> TokenCache:
    """The token cache a train set's per-step metrics count reads of: a window dataset's source,
    a packed dataset's ``input_ids``."""
    return dataset.examples.tokens if isinstance(dataset, PackedDataset) else dataset.source


@dataclass(frozen=True)
class _CausalFields:
    """meshbatch's order fields, shared by ``causal_lm`` and the mixtures' components."""

    shuffle: ShuffleField = False  # type: ignore[assignment]
    """Levanter's (false, true, an era length) or meshbatch's ``none | full | era | block``."""
    compat: Literal["levanter", "strong"] = "levanter"
    """``levanter`` (the default): Levanter's permutations and era shuffle bit for bit (marin's
    order for ``shuffle: block``), so a Levanter block with ``type:`` added keeps its batches;
    ``strong``: meshbatch's strong permutations (the Python API's default)."""
    era_length: int | None = None
    io_block_size: int | None = None
    window_blocks: int = 8
    reshuffle_each_epoch: bool = False
    quick_start: bool = False

    def shuffle_spec(self) -> ShuffleSpec:
        """Levanter's ``shuffle`` (``false``/``true``/era length) or meshbatch's named strategy as a
        ``ShuffleSpec`` with the config's order fields. Every field reaches ``ShuffleSpec``, which
        refuses one that does not apply (``io_block_size`` with ``shuffle: true``,
        ``reshuffle_each_epoch`` with no shuffle); without a shuffle ``permutation_type`` is dropped, as
        Levanter drops it, and ``compat: levanter`` holds as it is (cache order is Levanter's order).

            shuffle=true, io_block_size=4096 -> ValueError: io_block_size=4096 ... (got shuffle=True)
        """
        shuffle = self.shuffle
        strategy = {False: "none", True: "full"}[shuffle] if isinstance(shuffle, bool) else shuffle
        era_length = self.era_length
        if isinstance(strategy, int):
            if strategy < 0:
                raise ValueError(
                    f"shuffle must be true, false, an era length >= 1 or a strategy (got shuffle={shuffle})"
                )
            if self.era_length is not None:
                raise ValueError(
                    f"shuffle={shuffle} is Levanter's era length: era_length={self.era_length} contradicts it"
                )
            strategy, era_length = ("none", None) if strategy == 0 else ("era", strategy)
        if strategy != "block" and (self.io_block_size is not None or self.window_blocks != 8):
            raise ValueError(
                f"io_block_size={self.io_block_size} and window_blocks={self.window_blocks} only apply to "
                f"shuffle: block (got shuffle={shuffle!r})"
            )
        if strategy == "none" and self.reshuffle_each_epoch:
            raise ValueError(
                f"reshuffle_each_epoch={self.reshuffle_each_epoch} applies to a shuffle (got "
                f"shuffle={shuffle!r}, which keeps cache order)"
            )
        # no shuffle: compat holds as it is (one compat line serves every shuffle value of a run)
        compat = "levanter" if strategy != "none" and self.compat == "levanter" else None
        block = strategy == "block"
        kind = self.permutation_type or ("feistel" if block else "linear")
        return ShuffleSpec(
            strategy, kind="feistel" if strategy == "none" else kind, compat=compat, era_length=era_length,
            io_block_size=self.io_block_size, window_blocks=self.window_blocks,
            reshuffle_each_epoch=self.reshuffle_each_epoch,
        )  # fmt: skip


class _CausalLM:
    """A single source (the config itself: Levanter's URL or Hugging Face source) whose train and
    validation sets are meshbatch's ``CausalLMDataset`` windows (``TokenSeqDataset`` +
    ``CausalLmDataset``) with our shuffles and coalesced reads. A chat or supervised ``format``
    trains ``PackedDataset`` rows in Levanter's packing (``packed_dataset``), ordered by the same
    shuffle, one pass unless ``epochs`` (Levanter's packed dataset is finite).

    ``quick_start``: train while the train cache is still built (meshbatch's own builder, in a
    background thread); needs ``train_urls``, ``shuffle: era`` (or none), a text format and the
    fast path.
    """

    KIND = "causal_lm"

    def __post_init__(self):
        MeshbatchLMConfig.__post_init__(self)
        refuse(self, self.KIND)
        _checked(self, self.shuffle_spec)  # contradictions fail now, by name
        spec = self.shuffle_spec()
        if self.quick_start and spec.strategy not in GROWING_ORDERS:
            raise ConfigError(
                f"quick_start=true with shuffle={self.shuffle!r}: a {spec.strategy} shuffle needs the "
                "cache's final length; use shuffle: era (or none) to train while it is written"
            )
        if self.quick_start and not self.fast_path:
            raise ConfigError(
                "quick_start=true needs fast_path=true (Levanter's DataLoader needs a final length)"
            )
        if self.eos_id is not None and not isinstance(self.format, TextLmDatasetFormat):
            raise ConfigError(
                f"eos_id={self.eos_id} with format={type(self.format).__name__}: Levanter's packed chat/"
                "supervised dataset uses the tokenizer's EOS; drop eos_id"
            )
        if self.quick_start and not isinstance(self.format, TextLmDatasetFormat):
            raise ConfigError(f"quick_start=true needs a text format (got format={self.format!r})")

    @property
    def text(self) -> bool:
        return isinstance(self.format, TextLmDatasetFormat)

    def cache(self, split: str = "train") -> TokenCache | None:
        path = self.build_split(self, split, self.cache_dir)
        return None if path is None else TokenCache.open(path)

    def dataset(self, seq_len: int, split: str = "train") -> CausalLMDataset | PackedDataset:
        shuffle = self.shuffle_spec() if split == "train" else ShuffleSpec("none")
        if self.quick_start and split == "train":
            from .quick_start import growing_cache

            cache = growing_cache(self, self.cache_dir)
            return CausalLMDataset(cache, seq_len, shuffle=shuffle, eos_id=self.eos, ignore_id=self.ignore)
        path = self.build_split(self, split, self.cache_dir)
        if path is None:
            raise ValueError(f"no {split} urls or cache under cache_dir={self.cache_dir!r}")
        return self.rows(self.format, path, seq_len, shuffle)

    def train_set(self, Pos: Axis, batch_schedule=None, monitors=True, *, key, epochs: int | None = None):
        path = os.path.join(str(self.cache_dir), "train")
        if not self.text and self.build_split(self, "train", self.cache_dir) is None:
            raise ValueError("No training set!")
        dataset = self.dataset(Pos.size)
        epochs = epochs if self.text else epochs or 1  # Levanter's packed dataset: one pass unless epochs
        sources = {"": source_cache(dataset)}
        return self.announce(
            self.KIND, self.order(), {"": path}, dataset, sources, Pos=Pos, key=key, epochs=epochs
        )

    def order(self) -> dict:
        """The train set's order record (``order.py``): one source."""
        source = order.source_order(self.shuffle_spec()) | order.packed_order(self.format)
        return {"config": "single source", "sources": {"": source}}

    def train_sets(self, Pos: Axis, monitors=True, *, key, epochs: int | None = None):
        return {"": self.train_set(Pos, None, monitors, key=key, epochs=epochs)}

    def validation_sets(self, Pos: Axis, monitors=True) -> Mapping[str, AsyncDataset[LmExample]]:
        path = self.build_split(self, "validation", self.cache_dir)
        if path is None:
            return {}
        dataset = self.rows(self.format, path, Pos.size, ShuffleSpec("none"))
        return {"": MeshbatchDataset(dataset, Pos=Pos, key=0, epochs=1)}


@MeshbatchLMConfig.register_subclass("causal_lm")
@dataclass(frozen=True)
class CausalLMConfig(_CausalLM, _CausalFields, UrlSingleDatasetLMConfig, MeshbatchLMConfig):
    """Levanter's ``UrlSingleDatasetLMConfig`` (every field, flat), trained as ``_CausalLM``."""


@MeshbatchLMConfig.register_subclass("hf_causal_lm")
@dataclass(frozen=True)
class HfCausalLMConfig(_CausalLM, _CausalFields, HfSingleDatasetLMConfig, MeshbatchLMConfig):
    """Levanter's ``HfSingleDatasetLMConfig`` (a flat ``id:`` block: a hub dataset, or a local
    directory ``datasets.load_dataset`` reads), trained as ``_CausalLM``; quick start refused."""

    KIND = "hf_causal_lm"
