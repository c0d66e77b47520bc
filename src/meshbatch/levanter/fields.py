"""Every field of Levanter's data configs, per meshbatch config type: honoured or refused.

``FIELDS[type][name] = (HONOURED, how)`` or ``(REFUSED, why)``. A refused field set to anything
but Levanter's default fails at parse time (``refuse``) naming the field and the reason; an
honoured one keeps Levanter's meaning. ``tests/test_levanter_fields.py`` enumerates the dataclass
fields of the installed Levanter's config classes and fails for one missing here, so a field a
later Levanter adds is decided before it can be silently ignored. ``docs/levanter.md`` mirrors it.

    refuse(config, "token_balanced_mixture")   # train_weights={'a': 1.0} -> ConfigError naming it
"""

from __future__ import annotations

import dataclasses

from .sources import ConfigError

HONOURED, REFUSED = "honoured", "refused"

_TASK = {
    "tokenizer": (
        HONOURED,
        "Levanter's load_tokenizer: hub names (from the Hugging Face cache), local dirs; "
        "passthrough over pre-tokenized caches",
    ),
    "vocab_size": (HONOURED, "Levanter's: the passthrough tokenizer's vocabulary"),
    "cache_dir": (HONOURED, "Levanter's: where the caches are built and found"),
    "cache_options": (
        HONOURED,
        "Levanter's builder options (batch_size in process; all of them under cache_builder: ray)",
    ),
    "enforce_eos": (HONOURED, "Levanter's processor appends EOS when the tokenizer does not"),
    "chat_template": (
        HONOURED,
        "the template of chat sources whose format names none (Levanter's documented meaning)",
    ),
    "ignore_token_id": (
        HONOURED,
        "never a target (CausalLMDataset ignore_id; a negative id matches no token)",
    ),
    "shuffle": (
        HONOURED,
        "Levanter's: false none, true a full permutation, n an era shuffle of n; meshbatch adds block",
    ),
    "permutation_type": (HONOURED, "Levanter's: linear when unset (feistel for a block shuffle)"),
}
_SOURCE = {
    "tags": (HONOURED, "Levanter's tagged_eval_sets"),
    "format": (HONOURED, "Levanter's processor and, for chat/supervised, its packed datasets"),
    "train_urls": (HONOURED, "Levanter's UrlDataSource: fsspec, brace expansion, .gz/.zst"),
    "validation_urls": (HONOURED, "Levanter's UrlDataSource: the validation set"),
}
_HF = {
    "id": (HONOURED, "Levanter's WrappedHFDataSource"),
    "name": (HONOURED, "Levanter's WrappedHFDataSource"),
    "stream": (HONOURED, "Levanter's WrappedHFDataSource"),
}
_FORMATS = {
    "text_key": (HONOURED, "Levanter's BatchTokenizer"),
    "messages_field": (HONOURED, "Levanter's ChatProcessor"),
    "single_turn": (HONOURED, "Levanter's SingleTurnChatProcessor / SupervisedDataset"),
    "pack": (HONOURED, "Levanter's packed chat/supervised datasets"),
    "mask_user_turns": (HONOURED, "Levanter's ChatProcessor assistant masks"),
    "input_field": (HONOURED, "Levanter's SupervisedProcessor"),
    "output_field": (HONOURED, "Levanter's SupervisedProcessor"),
    "separate_with": (HONOURED, "Levanter's SupervisedProcessor"),
    "mask_inputs": (HONOURED, "Levanter's SupervisedDataset sources_len mask"),
}
_MIXTURE = {
    "configs": (HONOURED, "the components, each a causal_lm child over its Levanter-built cache"),
    "train_weights": (HONOURED, "meshbatch.Mixture weights (staged weights rescaled by the batch schedule)"),
    "stop_strategy": (HONOURED, "meshbatch.Mixture stop_strategy"),
    "mixture_block_size": (HONOURED, "meshbatch.Mixture block_size"),
    "target_budget": (
        REFUSED,
        "simulated epoching is not implemented by meshbatch (train it with Levanter's own mixture)",
    ),
    "experiment_budget": (
        REFUSED,
        "simulated epoching is not implemented by meshbatch (train it with Levanter's own mixture)",
    ),
    "max_train_batches": (REFUSED, "not implemented by meshbatch yet (train it with Levanter's own mixture)"),
    "num_validation_sequences": (
        REFUSED,
        "not implemented by meshbatch yet (train it with Levanter's own mixture)",
    ),
}
_BALANCED = dict(
    _MIXTURE,
    train_weights=(
        REFUSED,
        "the token-balanced interleave has no weights: it serves the least-consumed source",
    ),
    stop_strategy=(REFUSED, "the token-balanced interleave restarts every source (no stop strategy)"),
    mixture_block_size=(REFUSED, "the token-balanced interleave has no mixing blocks"),
)
_SPLICE_BASE = {
    "shuffle": (REFUSED, "a splice config's order is its schedule's (shuffle_offsets / shuffle_content)"),
    "permutation_type": (
        REFUSED,
        "a splice config's order is its schedule's (shuffle_offsets / shuffle_content)",
    ),
    "stop_strategy": (REFUSED, "a splice config reads one component (dataset_name)"),
    "mixture_block_size": (REFUSED, "a splice config reads one component (dataset_name)"),
    "train_weights": (
        HONOURED,
        "as Levanter's build_caches: dataset_name's weight must be positive (or absent)",
    ),
}

FIELDS: dict[str, dict[str, tuple[str, str]]] = {
    "causal_lm": {**_TASK, **_SOURCE, **_FORMATS},
    "stable_mixture": {**_TASK, **_MIXTURE, **_SOURCE, **_HF, **_FORMATS},
    "token_balanced_mixture": {**_TASK, **_BALANCED, **_SOURCE, **_HF, **_FORMATS},
    "splice": {  # the splice config itself (its text is base's)
        **_TASK,
        "shuffle": _SPLICE_BASE["shuffle"],
        "permutation_type": _SPLICE_BASE["permutation_type"],
        "cache_dir": (REFUSED, "a splice config's caches are its base's (base.cache_dir)"),
    },
    "splice base": {**_TASK, **_MIXTURE, **_SOURCE, **_HF, **_FORMATS, **_SPLICE_BASE},
}


def refuse(config, kind: str, skip: tuple[str, ...] = ()) -> None:
    """Raises ``ConfigError`` for the first refused field of ``FIELDS[kind]`` that ``config`` sets
    to anything but its dataclass default (the Levanter default)."""
    table = FIELDS[kind]
    for f in dataclasses.fields(config):
        status, why = table.get(f.name, (HONOURED, ""))
        if status != REFUSED or f.name in skip:
            continue
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()  # type: ignore[misc]
        value = getattr(config, f.name)
        if value != default:
            raise ConfigError(f"{f.name}={value!r} is refused by {kind}: {why}")


def fields_markdown() -> str:
    """The table of docs/levanter.md: a row per Levanter field, a column per config type
    (``honoured``, ``refused: why``, or ``-`` where the type has no such field)."""
    kinds = list(FIELDS)
    rows = ["| field | " + " | ".join(f"`{k}`" for k in kinds) + " | how it is honoured |",
            "|---" * (len(kinds) + 2) + "|"]  # fmt: skip
    names = list(dict.fromkeys(name for table in FIELDS.values() for name in table))
    for name in names:
        cells, how = [], ""
        for kind in kinds:
            status, note = FIELDS[kind].get(name, ("-", ""))
            cells.append(f"refused: {note}" if status == REFUSED else status)
            how = how or (note if status == HONOURED else "")
        rows.append(f"| `{name}` | " + " | ".join(cells) + f" | {how} |")
    return "\n".join(rows)
