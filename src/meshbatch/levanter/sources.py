"""The text behind a meshbatch data config: the seed's ``base:`` (one source or a mixture of
named ones), each a token cache built offline from local files, and ``ConfigError``."""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field

import draccus
from draccus.utils import ParsingError

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
        """The finished cache of ``split`` (``None`` without files for it); building one shows a
        progress bar on a terminal."""
        urls, path = self._split(split, name)
        if urls:
            self._build(path, urls, tokenizer_dir, progress=None)
        elif not os.path.isdir(path):
            return None
        return TokenCache.open(path)

    def growing_cache(self, tokenizer_dir: str, *, name: str) -> TokenCache:
        """Quick start: the train cache as it is written, by a background thread that commits
        every ``QUICK_START_FLUSH_TOKENS`` tokens (a finished cache is opened as ``cache`` does).
        Waits only for the build's first ledger; a build that fails before it raises here, one
        that fails later is logged and leaves the cache unfinished (the reader then waits for
        rows that never come; the next run resumes the build). A process that finishes first
        waits for the build at exit."""
        urls, path = self._split("train", name)
        if not urls:
            raise ValueError(f"source {name!r} has no train_urls: quick start builds the train cache")
        done = try_read_ledger(path)
        if done is not None and done.is_finished:
            return self.cache("train", tokenizer_dir, name=name)
        failed: list[BaseException] = []

        def build() -> None:
            try:
                self._build(path, urls, tokenizer_dir, progress=False, flush_tokens=QUICK_START_FLUSH_TOKENS)
            except BaseException as error:  # raised below, or logged
                failed.append(error)
                logger.exception("quick start: building the train cache %s failed", path)

        # Not a daemon: a process that ends first waits for the build (a daemon thread killed
        # inside TensorStore at exit aborts the process) and leaves a finished cache.
        thread = threading.Thread(target=build, name=f"meshbatch-build-{name}", daemon=False)
        thread.start()
        while try_read_ledger(path) is None:
            if not thread.is_alive():
                if failed:
                    raise failed[0]
                break
            time.sleep(0.02)
        return TokenCache.open(path, require_finished=False)

    def _split(self, split: str, name: str) -> tuple[list[str], str]:
        urls = {"train": self.train_urls, "validation": self.validation_urls}[split]
        if self.cache_dir is None:
            raise ValueError(f"source {name!r} needs cache_dir (where its {split} cache lives)")
        return list(urls), os.path.join(self.cache_dir, split)

    def _build(self, path: str, urls: list[str], tokenizer_dir: str, **kwargs) -> None:
        tokenizer = HFTokenizer(os.path.join(tokenizer_dir, "tokenizer.json"))
        build_cache(path, urls, tokenizer=tokenizer, text_key=self.format.text_key, **kwargs)


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
