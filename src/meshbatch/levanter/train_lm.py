"""Levanter's ``train_lm`` with meshbatch's data configs accepted under ``data:``.

    python -m meshbatch.levanter.train_lm --config_path cfg.yaml [--trainer.num_train_steps 100 ...]

Everything but ``data:`` is Levanter's own (model, optimizer, trainer, checkpointing, tracker):
``TrainLmConfig`` here is Levanter's with ``data`` widened to meshbatch's configs first, then
Levanter's single-dataset and mixture configs, so an unchanged Levanter YAML still runs.
Levanter 1.2.dev1644's ``TrainLmConfig.data`` is a closed ``Union`` (not a draccus registry), so
there is nothing to register into: this subclass is the way in. (No ``from __future__ import
annotations`` here: ``levanter.config.main`` reads ``main``'s annotation as a class.)

Decoding ``data:`` (``register``): a meshbatch ``type:`` decodes as that type only, with the useful
line first. draccus tries each member of the ``Union`` in turn and reports one line per member, the
one that matters buried among them. Here a block naming a meshbatch ``type:`` is decoded as that
type alone (its own error, unburied); one without ``type:`` is Levanter's own config, decoded as
Levanter's union of it; and what a user most likely meant comes first, with the working
alternative:

    type: causal_lm, id: ...       -> `data`: `id:` is a Hugging Face dataset: use type: hf_causal_lm ...
    type: stable_mixtrue           -> `data`: type: 'stable_mixtrue' is not a data config type (did
                                      you mean 'stable_mixture'?); the types are: causal_lm, ...
    type: splice_..., base: null   -> `data`: base: null: a splice config reads its text from base ...
"""

import dataclasses
import difflib
import functools
import logging
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Union

import levanter.config
from draccus.parsers import decoding
from draccus.parsers.decoding import decode_choice_class, get_decoding_fn
from draccus.utils import DecodingError
from levanter.data.text import LMMixtureDatasetConfig, SingleDatasetLMConfig
from levanter.main import train_lm as _train_lm

from .config import MeshbatchLMConfig
from .fast import fast_path, note
from .splice_config import SpliceMultiDocumentLMConfig

# The one field that tells a block's source kind, and the type that reads it.
SOURCE_FIELDS = {"id": "hf_causal_lm", "train_urls": "causal_lm", "validation_urls": "causal_lm",
                 "configs": "stable_mixture", "base": "splice_multi_document"}  # fmt: skip
WHAT = {"id": "`id:` is a Hugging Face dataset", "configs": "`configs:` is a mixture",
        "base": "`base:` is a splice config's text"}  # fmt: skip
SPLICE = ("splice_multi_document", "splice_single_document")


def _hint(name: str, raw: Mapping) -> str | None:
    """The working alternative for a field the named type does not read, or ``None``."""
    if name in SPLICE and "base" in raw and not isinstance(raw["base"], Mapping):
        value = "null" if raw["base"] is None else repr(raw["base"])
        return (
            f"base: {value}: a splice config reads its text from base: give it as "
            "base: {type: url_single_dataset, train_urls: [...]} or base: {type: mixture, configs: "
            "{...}, train_weights: {...}}"
        )
    for field_name, wanted in SOURCE_FIELDS.items():
        if field_name in raw and wanted != name and not _reads(name, field_name):
            what = WHAT.get(field_name, f"`{field_name}:` is a URL source")
            return f"{what}: use type: {wanted} (type: {name} does not read {field_name})"
    return None


def _reads(name: str, field_name: str) -> bool:
    return field_name in {f.name for f in dataclasses.fields(MeshbatchLMConfig.get_choice_class(name))}


def decoder(levanter_members: tuple[type, ...]) -> Callable[[Any, tuple], Any]:
    """The decoding function of ``data:``: a meshbatch ``type:`` decoded as that type alone
    (hints first, see the module docstring), a block without one as ``levanter_members``'s union."""
    levanter = get_decoding_fn(Union[levanter_members])  # noqa: UP007 (draccus needs a typing Union)

    def decode(raw: Any, path=()) -> Any:
        path = tuple(path)
        if not (isinstance(raw, Mapping) and "type" in raw):
            return levanter(raw, path)
        name = raw["type"]
        known = sorted(MeshbatchLMConfig.get_known_choices())
        if name not in known:
            close = difflib.get_close_matches(str(name), known, n=1)
            maybe = f" (did you mean {close[0]!r}?)" if close else ""
            raise DecodingError(
                path,
                f"type: {name!r} is not a data config type{maybe}; the types are: {', '.join(known)}; "
                "without type: the block is Levanter's own config (its own loader)",
            )
        hint = _hint(name, raw)
        if hint is not None:
            raise DecodingError(path, hint)
        return decode_choice_class(MeshbatchLMConfig, dict(raw), path)

    return decode


def register(data_type, levanter_members: tuple[type, ...]) -> None:
    """Decode ``data_type`` (the ``Union`` annotation of ``TrainLmConfig.data``) with ``decoder``.

    Not through ``draccus.decode.register``: draccus's command line treats a type with its own
    decoder as one opaque value, so ``--data.type causal_lm`` (and ``--data.<field>``) would no
    longer parse. draccus builds a union's decoder with ``decoding.decode_union``; that function
    is wrapped to return ``decoder`` for exactly these members, every other union unchanged."""
    members = set(typing.get_args(data_type))
    original = getattr(decoding.decode_union, "meshbatch_original", decoding.decode_union)

    def decode_union(*types):
        return decoder(levanter_members) if set(types) == members else original(*types)

    decode_union.meshbatch_original = original  # type: ignore[attr-defined]
    decoding.decode_union = decode_union
    decoding.get_decoding_fn.cache_clear()  # a decoder of the union made before is made again


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
    # the start line and cache progress in Levanter's log
    logging.getLogger("meshbatch").setLevel(logging.INFO)
    with fast_path():
        if not isinstance(config.data, MeshbatchLMConfig):
            levanter_data(config)
        _train_lm.main(config)


def levanter_data(config: TrainLmConfig) -> None:
    """A Levanter config (no meshbatch ``type:``): its order (the one Levanter's own ``train_set``
    gives, keyed as ``train_lm`` keys it) recorded with each checkpoint and checked on resume, as
    a meshbatch config's, and its start line, said when the trainer starts (``note``: once
    Levanter's log and tracker are set up)."""
    import jax

    from . import observe, order

    key = jax.random.split(jax.random.PRNGKey(config.trainer.seed), 4)[0]  # train_lm's data_key
    if config.data_seed is not None:
        key = jax.random.PRNGKey(config.data_seed)
    record = order.levanter_order(config.data, key)
    if record is None:
        return
    start = functools.partial(
        observe.start, type(config.data).__name__, record, loader=observe.LEVANTER_LOADER,
        why="Levanter's own config (no meshbatch type: under data:)", builder="Levanter's", caches={},
    )  # fmt: skip
    note(record, start=start)


if __name__ == "__main__":
    levanter.config.main(main)()
