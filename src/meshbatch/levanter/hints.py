"""Decoding ``data:``: a meshbatch ``type:`` decodes as that type only, with the useful line first.

Levanter's ``TrainLmConfig.data`` widened to meshbatch's configs is a ``Union`` (``train_lm``),
and draccus tries each member in turn and reports one line per member, the one that matters buried
among them. Here a block naming a meshbatch ``type:`` is decoded as that type alone (its own error,
unburied); one without ``type:`` is Levanter's own config, decoded as Levanter's union of it; and
what a user most likely meant comes first, with the working alternative:

    type: causal_lm, id: ...       -> `data`: `id:` is a Hugging Face dataset: use type: hf_causal_lm ...
    type: stable_mixtrue           -> `data`: type: 'stable_mixtrue' is not a data config type (did
                                      you mean 'stable_mixture'?); the types are: causal_lm, ...
    type: splice_..., base: null   -> `data`: base: null: a splice config reads its text from base ...
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Mapping
from typing import Any

from draccus.parsers.decoding import decode_choice_class, get_decoding_fn
from draccus.utils import DecodingError

# The one field that tells a block's source kind, and the type that reads it.
SOURCE_FIELDS = {"id": "hf_causal_lm", "train_urls": "causal_lm", "validation_urls": "causal_lm",
                 "configs": "stable_mixture", "base": "splice_multi_document"}  # fmt: skip
WHAT = {"id": "`id:` is a Hugging Face dataset", "configs": "`configs:` is a mixture",
        "base": "`base:` is a splice config's text"}  # fmt: skip
SPLICE = ("splice_multi_document", "splice_single_document")


def source_type(source) -> str:
    """The single-source type that trains ``source`` (a Levanter source config): ``hf_causal_lm``
    for a Hugging Face ``id:``, else ``causal_lm``."""
    return "hf_causal_lm" if getattr(source, "id", None) is not None else "causal_lm"


def _hint(name: str, raw: Mapping) -> str | None:
    """The working alternative for a field the named type does not read, or ``None``."""
    if name in SPLICE and "base" in raw and not isinstance(raw["base"], Mapping):
        value = "null" if raw["base"] is None else repr(raw["base"])
        return (
            f"base: {value}: a splice config reads its text from base: give it as "
            "base: {type: url_single_dataset, train_urls: [...]} or base: {type: mixture, configs: "
            "{...}, train_weights: {...}}"
        )
    for field, wanted in SOURCE_FIELDS.items():
        if field in raw and wanted != name and not _reads(name, field):
            what = WHAT.get(field, f"`{field}:` is a URL source")
            return f"{what}: use type: {wanted} (type: {name} does not read {field})"
    return None


def _reads(name: str, field: str) -> bool:
    import dataclasses

    from .config import MeshbatchLMConfig

    return field in {f.name for f in dataclasses.fields(MeshbatchLMConfig.get_choice_class(name))}


def decoder(levanter_members: tuple[type, ...]) -> Callable[[Any, tuple], Any]:
    """The decoding function of ``data:``: a meshbatch ``type:`` decoded as that type alone
    (hints first, see the module docstring), a block without one as ``levanter_members``'s union."""
    from typing import Union

    from .config import MeshbatchLMConfig

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
    import typing

    from draccus.parsers import decoding

    members = set(typing.get_args(data_type))
    original = getattr(decoding.decode_union, "meshbatch_original", decoding.decode_union)

    def decode_union(*types):
        return decoder(levanter_members) if set(types) == members else original(*types)

    decode_union.meshbatch_original = original  # type: ignore[attr-defined]
    decoding.decode_union = decode_union
    decoding.get_decoding_fn.cache_clear()  # a decoder of the union made before is made again
