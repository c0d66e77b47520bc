"""The seed's ``base:`` of a splice config (Levanter's own single-dataset or mixture config),
``ConfigError``, and quick start's growing train cache.

``base: {type: url_single_dataset, ...}`` is Levanter's ``UrlSingleDatasetLMConfig`` and ``base:
{type: mixture, configs: ..., train_weights: ...}`` its ``LMMixtureDatasetConfig`` (plus the
seed's ``shuffle_per_epoch``); a splice config reads one component of it (``dataset_name``).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass

import draccus
from draccus.utils import ParsingError
from levanter.data.text import LMMixtureDatasetConfig, UrlSingleDatasetLMConfig

from meshbatch.cache import HFTokenizer, TokenCache, build_cache
from meshbatch.cache.ledger import try_read_ledger

logger = logging.getLogger(__name__)
QUICK_START_FLUSH_TOKENS = 1 << 20  # a quick-start build commits every 1Mi tokens


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
    """The seed's ``base:``: the text the documents come from."""

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
    ``cache_dir/name``, as Levanter's ``build_caches``) and the seed's ``shuffle_per_epoch``."""

    shuffle_per_epoch: bool | None = None  # the seed's; a splice config checks it against its own

    def stages(self) -> list[tuple[int, dict[str, float]]]:
        """``train_weights`` as ``(start_step, weights)`` stages."""
        if isinstance(self.train_weights, Mapping):
            return [(0, dict(self.train_weights))]
        return [(int(start), dict(weights)) for start, weights in self.train_weights]

    def __post_init__(self):
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


def tokenizer_file(name: str) -> str:
    """The ``tokenizer.json`` of a local directory or of a hub name in the Hugging Face cache."""
    if os.path.isfile(os.path.join(name, "tokenizer.json")):
        return os.path.join(name, "tokenizer.json")
    from transformers.utils import cached_file

    return cached_file(name, "tokenizer.json")


def growing_cache(config, cache_dir: str | None) -> TokenCache:
    """Quick start: the train cache as it is written by meshbatch's builder in a background
    thread committing every ``QUICK_START_FLUSH_TOKENS`` tokens (a finished cache is opened as
    is). Waits only for the first ledger; a build failing before it raises here, one failing
    later is logged and leaves the cache unfinished (the next run resumes it)."""
    if not config.train_urls:
        raise ValueError("quick start builds the train cache: give train_urls")
    if cache_dir is None:
        raise ValueError("quick start needs cache_dir")
    path = os.path.join(cache_dir, "train")
    done = try_read_ledger(path)
    if done is not None and done.is_finished:
        return TokenCache.open(path)
    tokenizer = HFTokenizer(tokenizer_file(config.tokenizer))
    urls = list(config.train_urls)
    failed: list[BaseException] = []

    def build() -> None:
        try:
            build_cache(path, urls, tokenizer=tokenizer, text_key=config.format.text_key, progress=False,
                        flush_tokens=QUICK_START_FLUSH_TOKENS)  # fmt: skip
        except BaseException as error:  # raised below, or logged
            failed.append(error)
            logger.exception("quick start: building the train cache %s failed", path)

    # Not a daemon: a process that ends first waits for the build (a daemon thread killed inside
    # TensorStore at exit aborts the process) and leaves a finished cache.
    thread = threading.Thread(target=build, name="meshbatch-build", daemon=False)
    thread.start()
    logger.info("meshbatch: quick start: cache %s being built in the background", path)
    while try_read_ledger(path) is None:
        if not thread.is_alive():
            if failed:
                raise failed[0]
            break
        time.sleep(0.02)
    return TokenCache.open(path, require_finished=False)
