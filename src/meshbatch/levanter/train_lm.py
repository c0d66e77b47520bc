"""Levanter's ``train_lm`` with meshbatch's data configs accepted under ``data:``.

    python -m meshbatch.levanter.train_lm --config_path cfg.yaml [--trainer.num_train_steps 100 ...]

Everything but ``data:`` is Levanter's own (model, optimizer, trainer, checkpointing, tracker):
``TrainLmConfig`` here is Levanter's with ``data`` widened to meshbatch's configs first, then
Levanter's single-dataset and mixture configs, so an unchanged Levanter YAML still runs.
Levanter 1.2.dev1644's ``TrainLmConfig.data`` is a closed ``Union`` (not a draccus registry), so
there is nothing to register into: this subclass is the way in. (No ``from __future__ import
annotations`` here: ``levanter.config.main`` reads ``main``'s annotation as a class.)
"""

import logging
from dataclasses import dataclass, field
from typing import Union

import levanter.config
from levanter.data.text import LMMixtureDatasetConfig, SingleDatasetLMConfig
from levanter.main import train_lm as _train_lm

from .config import MeshbatchLMConfig
from .fast import fast_path, note_start
from .hints import register
from .splice_config import SpliceMultiDocumentLMConfig

DataConfig = Union[MeshbatchLMConfig, SingleDatasetLMConfig, LMMixtureDatasetConfig]  # noqa: UP007
# a meshbatch type: decodes as that type alone, its error first; without type: Levanter's own
register(DataConfig, (SingleDatasetLMConfig, LMMixtureDatasetConfig))


@dataclass
class TrainLmConfig(_train_lm.TrainLmConfig):
    """Levanter's ``TrainLmConfig``; ``data`` also takes ``type: splice_multi_document``,
    ``splice_single_document``, ``causal_lm``, ``stable_mixture`` or ``token_balanced_mixture``."""

    data: DataConfig = field(default_factory=SpliceMultiDocumentLMConfig)


def main(config: TrainLmConfig) -> None:
    """Runs Levanter's ``train_lm.main`` on ``config``, meshbatch datasets on the fast path
    (``data.fast_path: false`` keeps Levanter's ``DataLoader``)."""
    logging.getLogger("meshbatch").setLevel(
        logging.INFO
    )  # the start line and cache progress in Levanter's log
    with fast_path():
        if not isinstance(config.data, MeshbatchLMConfig):
            levanter_data(config)
        _train_lm.main(config)


def levanter_data(config: TrainLmConfig) -> None:
    """A Levanter config (no meshbatch ``type:``): its order (the one Levanter's own ``train_set``
    gives, keyed as ``train_lm`` keys it) recorded with each checkpoint and checked on resume, as
    a meshbatch config's, and its start line, said when the trainer starts (``note_start``: once
    Levanter's log and tracker are set up)."""
    import jax

    from . import observe, order

    key = jax.random.split(jax.random.PRNGKey(config.trainer.seed), 4)[0]  # train_lm's data_key
    if config.data_seed is not None:
        key = jax.random.PRNGKey(config.data_seed)
    record = order.levanter_order(config.data, key)
    if record is None:
        return
    order.note(record)
    note_start(lambda: observe.start(type(config.data).__name__, record, loader=observe.LEVANTER_LOADER,
                                     why="Levanter's own config (no meshbatch type: under data:)",
                                     builder="Levanter's", caches={}))  # fmt: skip


if __name__ == "__main__":
    levanter.config.main(main)()
