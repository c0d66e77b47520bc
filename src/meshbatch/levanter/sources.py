"""The ``base:`` of a splice config (Levanter's own single-dataset or mixture config),
and ``ConfigError``.

``base: {type: url_single_dataset, ...}`` is Levanter's ``UrlSingleDatasetLMConfig`` and ``base:
{type: mixture, configs: ..., train_weights: ...}`` its ``LMMixtureDatasetConfig`` (plus the
splice base's ``shuffle_per_epoch``); a splice config reads one component of it (``dataset_name``).
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass

import draccus
from draccus.utils import ParsingError
from levanter.data.text import LMMixtureDatasetConfig, UrlSingleDatasetLMConfig

logger = logging.getLogger(__name__)


class ConfigError(ParsingError):
    """A data config whose values contradict each other (raised from ``__post_init__``).

    Not a ``ValueError``: draccus replaces the message of a ``ValueError`` raised while it builds
    a dataclass with "Couldn't instantiate class ...", and a YAML user must see which field."""


def _checked(config, check) -> None:
    """Runs ``check()``, turning a ``TypeError``/``ValueError`` into a ``ConfigError`` naming ``config``."""
    try:
        check()
    except (TypeError, ValueError, AssertionError) as error:
        raise ConfigError(f"{type(config).__name__}: {error}") from error


@dataclass(frozen=True)
class BaseDataConfig(draccus.ChoiceRegistry):
    """A splice config's ``base:``: the text the documents come from."""

    @classmethod
    def default_choice_name(cls) -> str | None:
        return "url_single_dataset"

    def components(self) -> dict[str, tuple[object, str | None]]:
        """``{name: (source, cache_dir)}`` as Levanter resolves them."""
        raise NotImplementedError


@BaseDataConfig.register_subclass("url_single_dataset")
@dataclass(frozen=True)
class UrlBaseConfig(UrlSingleDatasetLMConfig, BaseDataConfig):
    """Levanter's ``UrlSingleDatasetLMConfig``; its component's name is ``name``."""

    name: str = "default"

    def components(self) -> dict[str, tuple[object, str | None]]:
        return {self.name: (self, self.cache_dir)}


@BaseDataConfig.register_subclass("mixture")
@dataclass(frozen=True)
class MixtureBaseConfig(LMMixtureDatasetConfig, BaseDataConfig):
    """Levanter's ``LMMixtureDatasetConfig`` (a component's cache is its ``cache_dir``, else
    ``cache_dir/name``, as Levanter's ``build_caches``) and the splice base's ``shuffle_per_epoch``."""

    shuffle_per_epoch: bool | None = None  # a splice config checks it against its own

    def stages(self) -> list[tuple[int, dict[str, float]]]:
        """``train_weights`` as ``(start_step, weights)`` stages."""
        if isinstance(self.train_weights, Mapping):
            return [(0, dict(self.train_weights))]
        return [(int(start), dict(weights)) for start, weights in self.train_weights]

    def check_weights(self) -> None:
        """Every weight of every stage a finite number >= 0, checked before any component is
        dropped for weight 0 (Levanter's ``MixtureDataset`` refuses a negative weight too; a NaN
        or infinite one it would mix silently):

            train_weights: {web: -0.5, code: 0.5}  -> ConfigError: train_weights['web']=-0.5 ...
        """
        staged = not isinstance(self.train_weights, Mapping)
        for index, (start, weights) in enumerate(self.stages()):
            where = f"train_weights[{index}] (stage from step {start})" if staged else "train_weights"
            for name, weight in weights.items():
                if isinstance(weight, bool) or not isinstance(weight, int | float):
                    raise ConfigError(f"{where}[{name!r}]={weight!r} is not a number")
                if not math.isfinite(weight) or weight < 0:
                    raise ConfigError(
                        f"{where}[{name!r}]={weight!r}: a weight must be a finite number >= 0 "
                        "(0 leaves the component out of training; Levanter refuses a negative weight)"
                    )

    def __post_init__(self):
        self.check_weights()
        unknown = sorted({name for _, weights in self.stages() for name in weights} - set(self.configs))
        if unknown:
            raise ConfigError(f"train_weights names {unknown} missing from configs {sorted(self.configs)}")
        if not self.configs:
            raise ConfigError("configs is empty: a mixture needs at least one component")
        _checked(self, super().__post_init__)

    def components(self) -> dict[str, tuple[object, str | None]]:
        def cache_dir(name, source):
            if source.cache_dir is not None:
                return source.cache_dir
            return None if self.cache_dir is None else os.path.join(self.cache_dir, name)

        return {name: (source, cache_dir(name, source)) for name, source in self.configs.items()}
