"""Mixture configs: ``stable_mixture`` (``meshbatch.Mixture``) and ``token_balanced_mixture``
(``meshbatch.TokenBalancedMixture``) of causal-LM windows of a mixture base's components."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

from haliax import Axis
from levanter.data.dataset import AsyncDataset
from levanter.models.lm_model import LmExample

from meshbatch.cache import TokenCache
from meshbatch.datasets.causal import CausalLMDataset
from meshbatch.datasets.mixtures import Mixture, TokenBalancedMixture
from meshbatch.shuffles.shuffle_spec import ShuffleSpec

from .async_datasets import MeshbatchDataset
from .config import CausalLMConfig, MeshbatchLMConfig
from .sources import BaseDataConfig, ConfigError, MixtureBaseConfig, SourceConfig


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
