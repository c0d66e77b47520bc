"""Mixture configs: Levanter's ``LMMixtureDatasetConfig`` (every field, flat) whose train set is
``meshbatch.Mixture`` (``stable_mixture``) or ``meshbatch.TokenBalancedMixture``
(``token_balanced_mixture``) of each component's Levanter-built cache: ``CausalLMDataset``
windows of a text component, ``PackedDataset`` rows in Levanter's packing of a chat or supervised
one (``config.packed_dataset``; a mixture of text and chat components, as Levanter's
``gpt2_small_fast_mix_chat.yaml`` writes it), and whose validation sets are each component's.

    data:
      type: stable_mixture                 # the one line added to a Levanter mixture block
      cache_dir: cache/pile
      tokenizer: gpt2
      configs: {arxiv: {train_urls: [...]}, github: {train_urls: [...]}}
      train_weights: {arxiv: 0.6, github: 0.4}
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

import jax
from haliax import Axis
from levanter.data.dataset import AsyncDataset
from levanter.models.lm_model import LmExample
from levanter.utils.jax_utils import key_iterator

from meshbatch.cache import TokenCache
from meshbatch.datasets.causal import CausalLMDataset
from meshbatch.datasets.mixtures import Mixture, TokenBalancedMixture, child_keys
from meshbatch.datasets.packed import PackedDataset
from meshbatch.shuffles.shuffle_spec import ShuffleSpec

from . import order
from .async_datasets import MeshbatchDataset
from .config import MeshbatchLMConfig, _CausalFields, source_cache
from .fields import refuse
from .sources import ConfigError, MixtureBaseConfig, _checked

logger = logging.getLogger(__name__)


class LevanterKeyedMixture(Mixture):
    """``mixture_compat: levanter``: a ``Mixture`` whose keys are ``LMMixtureDatasetConfig``'s
    (``train_set``: ``mix_key, shuffle_key = split(key)``; ``train_sets``: ``key_iterator(
    shuffle_key)`` handed to the built components in ``configs`` order), not meshbatch's
    name-keyed ``derive_keys``. A component's key is thus its place among the built ones:

        configs a, z, b; train_weights {a: 0.6, z: 0, b: 0.4}   (z is not built for train)
        Levanter and this    a <- key_iterator(shuffle_key) 1st, b <- 2nd
        meshbatch default    a <- fold_in(children_key, crc32("a")), b <- ... crc32("b")
    """

    def derive_keys(self, key):
        mixture_key, shuffle_key = jax.random.split(key)
        return mixture_key, levanter_keys(shuffle_key, self.names)


def levanter_keys(shuffle_key, names) -> dict:
    """``LMMixtureDatasetConfig.train_sets``' component keys: ``key_iterator(shuffle_key)`` in order."""
    keys = key_iterator(shuffle_key)
    return {name: next(keys) for name in names}


def stage_weights(weights: Mapping[str, float], names) -> dict[str, float]:
    """A stage's weights over the built components ``names``, as Levanter reads them: the
    components not built (0 in every stage, or no data) dropped, a built one the stage does not
    name at 0 (``{a: 1.0, z: 0.0}`` over ``[a, b]`` -> ``{a: 1.0, b: 0.0}``)."""
    out = {name: w for name, w in weights.items() if name in names}
    return out | {name: 0.0 for name in names if name not in out}


@dataclass(frozen=True)
class _MixtureConfig(_CausalFields, MixtureBaseConfig, MeshbatchLMConfig):
    """Every component's rows (causal-LM windows of a text component, packed examples of a chat or
    supervised one), mixed; ``shuffle`` and the order fields apply to every component (Levanter
    shuffles components, not the mixture)."""

    KIND = "mixture"

    def __post_init__(self):
        MixtureBaseConfig.__post_init__(self)
        MeshbatchLMConfig.__post_init__(self)
        refuse(self, self.KIND)
        if self.quick_start:
            raise ConfigError(
                "quick_start=true is for causal_lm (one source); a mixture needs its caches built"
            )
        _checked(self, self.shuffle_spec)

    def weighted(self, split: str) -> list[str]:
        """The components built for ``split``: Levanter's rule (train: a positive weight in
        some stage; a token-balanced mixture has no weights and builds all)."""
        if split != "train" or not self.train_weights:
            return list(self.configs)
        return [name for name in self.configs if any(w.get(name, 0) > 0 for _, w in self.stages())]

    def paths(self, split: str) -> dict[str, tuple[object, str]]:
        """Each component built for ``split`` that has data: its source config and cache path."""
        out = {}
        for name, (source, cache_dir) in self.components().items():
            if name not in self.weighted(split):
                continue
            path = self.build_split(source, split, cache_dir)
            if path is not None:
                out[name] = (source, path)
        return out

    def caches(self, split: str) -> dict[str, TokenCache]:
        return {name: TokenCache.open(path) for name, (_, path) in self.paths(split).items()}

    def children(self, seq_len: int, split: str = "train") -> dict[str, CausalLMDataset | PackedDataset]:
        shuffle = self.shuffle_spec() if split == "train" else ShuffleSpec("none")
        return {
            name: self.rows(source.format, path, seq_len, shuffle)
            for name, (source, path) in self.paths(split).items()
        }

    def train_sets(self, Pos: Axis, monitors=True, *, key, epochs: int | None = None, **kwargs):
        """Each built component's (shuffled) windows by name, as Levanter's ``train_sets``
        (``eval_lm``'s ``eval_on_train``): ``train_set(key)`` mixes ``train_sets`` of
        ``split(key)[1]``. The keys are ``key_iterator(key)`` in order under ``mixture_compat:
        levanter``, else ``fold_in(key, crc32(name))`` (see ``LevanterKeyedMixture``)."""
        if epochs:
            raise ValueError("Epochs are not supported for mixture datasets")  # Levanter's rule
        children = self.children(Pos.size)
        levanter = getattr(self, "mixture_compat", None) == "levanter"
        keys = (levanter_keys if levanter else child_keys)(key, list(children))
        return {
            name: MeshbatchDataset(child, Pos=Pos, key=keys[name], epochs=None, fast_path=self.fast_path)
            for name, child in children.items()
        }

    def validation_sets(self, Pos: Axis, monitors=True) -> Mapping[str, AsyncDataset[LmExample]]:
        """Each component's validation windows, an eval set per component (tagged by name)."""
        return {
            name: MeshbatchDataset(dataset, Pos=Pos, key=0, epochs=1)
            for name, dataset in self.children(Pos.size, "validation").items()
        }

    def train_set(self, Pos: Axis, batch_schedule=None, monitors=True, *, key, epochs: int | None = None):
        if epochs:
            raise ValueError("Epochs are not supported for mixture datasets")  # Levanter's rule
        dataset = self.dataset(Pos.size, batch_schedule)
        named = zip(dataset.names, dataset.children, strict=True)
        sources = {name: source_cache(child) for name, child in named}
        paths = {name: cache.path for name, cache in sources.items()}
        record = self.order(dataset.names)
        return self.announce(self.KIND, record, paths, dataset, sources, Pos=Pos, key=key, epochs=None)

    def order(self, names: list[str]) -> dict:
        """The train set's order record (``order.py``) over the built components ``names``."""
        return order.mixture(names, order.source_order(self.shuffle_spec()), self.configs)


@MeshbatchLMConfig.register_subclass("stable_mixture")
@dataclass(frozen=True)
class StableMixtureLMConfig(_MixtureConfig):
    """Levanter's stable mixture (``meshbatch.Mixture``): ``train_weights`` (or staged weights)
    of ``configs``, ``mixture_block_size`` rows a block, ``stop_strategy``; ``mixture_compat:
    levanter`` gives the installed Levanter's ``MixtureDataset`` rows and component keys
    (``LevanterKeyedMixture``), so with ``compat: levanter`` its batches are Levanter's."""

    KIND = "stable_mixture"
    stop_strategy: Literal["restart", "first_exhausted", "all_exhausted"] = "restart"  # type: ignore[assignment]
    mixture_compat: Literal["levanter", "exact"] = "levanter"
    """``levanter`` (the default): Levanter's ``MixtureDataset`` rows (its block counts and block
    order) and component keys (``key_iterator`` over the built components, in ``configs`` order);
    ``exact``: meshbatch's exact largest-remainder shares per block and components keyed by name
    (adding or removing one leaves the others' orders), the Python API's ``Mixture`` default."""

    def mixture(self, seq_len: int, batch_size=None) -> Mixture:
        if not any(w > 0 for _, weights in self.stages() for w in weights.values()):
            raise ValueError(  # Levanter builds no component and fails: "Datasets cannot be empty"
                f"train_weights={self.train_weights!r} gives no component a positive weight: "
                f"nothing to train on (components: {list(self.configs)})"
            )
        children = self.children(seq_len)
        unbuilt = [name for name in self.weighted("train") if name not in children]
        if unbuilt and self.mixture_compat == "levanter":
            raise ValueError(
                f"configs {unbuilt} have a positive train weight but no train data or cache: Levanter "
                "skips them yet keeps their weights in each block's total, which mixture_compat: "
                "levanter does not reproduce (give them train data, or weight 0)"
            )
        if unbuilt:  # mixture_compat: exact
            logger.warning("meshbatch: configs %s have no train data or cache: mixing the others", unbuilt)
        stages = [(start, stage_weights(weights, children)) for start, weights in self.stages()]
        weights = stages[0][1] if len(stages) == 1 and stages[0][0] == 0 else stages
        levanter = self.mixture_compat == "levanter"
        return (LevanterKeyedMixture if levanter else Mixture)(
            children,
            weights,
            block_size=self.mixture_block_size,
            stop_strategy=self.stop_strategy,
            compat="levanter" if levanter else None,
            batch_size=batch_size,
        )

    def dataset(self, seq_len: int, batch_schedule=None) -> Mixture:
        return self.mixture(seq_len, getattr(batch_schedule, "schedule", batch_schedule))

    def order(self, names: list[str]) -> dict:
        rows = {
            "mixture_compat": self.mixture_compat,
            "mixture_block_size": self.mixture_block_size,
            "stop_strategy": self.stop_strategy,
            "train_weights": order.stages(self.train_weights, names),
        }
        return super().order(names) | rows


@MeshbatchLMConfig.register_subclass("token_balanced_mixture")
@dataclass(frozen=True)
class TokenBalancedMixtureLMConfig(_MixtureConfig):
    """The token-balanced least-consumed interleave (``meshbatch.TokenBalancedMixture``) of every
    component (``train_weights``, ``stop_strategy``, ``mixture_block_size`` refused). It is
    sequential, so it trains on the fast path only; a resumed run replays its plans from step 0
    (host planning only, no reads) only when its checkpoint lacks the saved state (``fast.restore``)."""

    KIND = "token_balanced_mixture"
    baseline: Literal["zero", "min", "mean"] = "zero"

    def __post_init__(self):
        super().__post_init__()
        if not self.fast_path:
            raise ConfigError("token_balanced_mixture is sequential: it needs fast_path: true")

    def dataset(self, seq_len: int, batch_schedule=None) -> TokenBalancedMixture:
        return TokenBalancedMixture(self.children(seq_len), baseline=self.baseline)

    def order(self, names: list[str]) -> dict:
        return super().order(names) | {"config": "token_balanced_mixture", "baseline": self.baseline}
