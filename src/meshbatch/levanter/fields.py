"""Every field of every meshbatch data config, per config type: honoured or refused.

``FIELDS[type][name]`` decides each field of the installed Levanter's data config classes and
``OWN[type][name]`` each field meshbatch adds: ``(HONOURED, how)`` or ``(REFUSED, why)``. A
refused field set to anything but its default fails at parse time (``refuse``) naming the field
and the reason; an honoured one keeps its meaning. ``refuse`` also fails for a field of the config
that neither table decides (a meshbatch bug, caught by any test parsing that type), and
``tests/levanter/test_levanter_fields.py`` checks both tables against the installed Levanter's classes and
meshbatch's, so no field, Levanter's or meshbatch's, is silently ignored. ``docs/levanter.md``
mirrors both tables (that test's ``fields_markdown`` renders them).

    refuse(config, "token_balanced_mixture")   # train_weights={'a': 1.0} -> ConfigError naming it
"""

from __future__ import annotations

import dataclasses

from meshbatch.datasets.splice.splice_spec import SpliceSpec

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
        REFUSED,
        "the installed Levanter never reads the top-level chat_template (a chat format naming none "
        "uses the tokenizer's own): name the template in format.chat_template",
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
    "format": (
        HONOURED,
        "Levanter's processor; chat/supervised: PackedDataset rows in Levanter's packing (compat='levanter')",
    ),
    "train_urls": (HONOURED, "Levanter's UrlDataSource: fsspec, brace expansion, .gz/.zst"),
    "validation_urls": (HONOURED, "Levanter's UrlDataSource: the validation set"),
}
_HF = dict.fromkeys(("id", "name", "stream"), (HONOURED, "Levanter's WrappedHFDataSource"))
_FORMATS = {
    "text_key": (HONOURED, "Levanter's BatchTokenizer"),
    "messages_field": (HONOURED, "Levanter's ChatProcessor"),
    "single_turn": (HONOURED, "Levanter's SingleTurnChatProcessor; packed as supervised, as Levanter"),
    "pack": (HONOURED, "PackedDataset(pack=...): false is one example a row, as Levanter's"),
    "mask_user_turns": (HONOURED, "PackedDataset(mask_prompt=...): loss on assistant tokens only"),
    **dict.fromkeys(
        ("input_field", "output_field", "separate_with"), (HONOURED, "Levanter's SupervisedProcessor")
    ),
    "mask_inputs": (HONOURED, "PackedDataset(mask_prompt=...): loss on completion tokens only"),
}
_EPOCHING = (
    REFUSED,
    "simulated epoching is not implemented by meshbatch (train it with Levanter's own mixture)",
)
_NOT_YET = (REFUSED, "not implemented by meshbatch yet (train it with Levanter's own mixture)")
_MIXTURE = {
    "configs": (
        HONOURED,
        "the components, each a causal_lm child (windows; packed chat/supervised rows) over its "
        "Levanter-built cache",
    ),
    "train_weights": (HONOURED, "meshbatch.Mixture weights (staged weights rescaled by the batch schedule)"),
    "stop_strategy": (HONOURED, "meshbatch.Mixture stop_strategy"),
    "mixture_block_size": (HONOURED, "meshbatch.Mixture block_size"),
    "target_budget": _EPOCHING,
    "experiment_budget": _EPOCHING,
    "max_train_batches": _NOT_YET,
    "num_validation_sequences": _NOT_YET,
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
_TEXT_ONLY = (REFUSED, "meshbatch splices text: a chat/supervised source is refused by name")
_AS_SPLICE = "as the splice config's own (the cache is built with it): Levanter's default or the same value"
_SCHEDULE = (REFUSED, "a splice config's order is its schedule's (shuffle_offsets / shuffle_content)")
_GRID = (REFUSED, "a splice config's validation set is the splice grid (validation_starts/offsets)")
_SPLICE_BASE = {
    "shuffle": _SCHEDULE,
    "permutation_type": _SCHEDULE,
    **dict.fromkeys(
        ("stop_strategy", "mixture_block_size"),
        (REFUSED, "a splice config reads one component (dataset_name)"),
    ),
    "train_weights": (
        HONOURED,
        "as Levanter's build_caches: dataset_name's weight must be positive (or absent)",
    ),
    "tokenizer": (HONOURED, "as the splice config's own: gpt2 (Levanter's default, unset) or the same name"),
    **dict.fromkeys(("vocab_size", "enforce_eos", "cache_options"), (HONOURED, _AS_SPLICE)),
    "chat_template": _TEXT_ONLY,
    "ignore_token_id": (REFUSED, "a splice example's loss mask is its schedule's (the copied content)"),
    "format": (HONOURED, "text only (a chat/supervised base is refused by name): text_key"),
    "tags": _GRID,
    "validation_urls": _GRID,
    "max_train_batches": (
        HONOURED,
        "max_train_batches[dataset_name] bounds the training subset (restrict_to_training_subset)",
    ),
    "name": (HONOURED, "a url_single_dataset base's component name; an HF component's (Levanter's)"),
}

FIELDS: dict[str, dict[str, tuple[str, str]]] = {
    "causal_lm": {**_TASK, **_SOURCE, **_FORMATS},
    "hf_causal_lm": {**_TASK, "tags": _SOURCE["tags"], "format": _SOURCE["format"], **_HF, **_FORMATS},
    "stable_mixture": {**_TASK, **_MIXTURE, **_SOURCE, **_HF, **_FORMATS},
    "token_balanced_mixture": {**_TASK, **_BALANCED, **_SOURCE, **_HF, **_FORMATS},
    "splice": {  # the splice config itself (its text is base's)
        **_TASK,
        "shuffle": _SCHEDULE,
        "permutation_type": _SCHEDULE,
        "cache_dir": (REFUSED, "a splice config's caches are its base's (base.cache_dir)"),
        "chat_template": _TEXT_ONLY,
        "ignore_token_id": _SPLICE_BASE["ignore_token_id"],
    },
    "splice base": {**_TASK, **_MIXTURE, **_SOURCE, **_HF, **_FORMATS, **_SPLICE_BASE},
}

# The fields meshbatch adds, per config type (rendered as the second table of docs/levanter.md).
_MESHBATCH = {
    "fast_path": (HONOURED, "PipelineLoader (false: Levanter's DataLoader)"),
    "cache_builder": (HONOURED, "in_process (Levanter's processor and writer) or ray (its Ray builder)"),
    "eos_id": (HONOURED, "segments split after it (>= 0; unset: the tokenizer's EOS; text formats)"),
    "metrics_every": (HONOURED, "per-step data metrics every n steps (>= 0; 0: never)"),
}
_ORDER = {
    name: (HONOURED, "a ShuffleSpec field, refused by name where the shuffle does not use it")
    for name in ("era_length", "io_block_size", "window_blocks", "reshuffle_each_epoch")
} | {
    "compat": (
        HONOURED,
        "levanter (the default): Levanter's permutations and era shuffle (marin's block shuffle); "
        "strong: meshbatch's strong permutations",
    )
}
_QUICK = (HONOURED, "causal_lm's growing train cache (text, era or no shuffle, fast path)")
_MIXTURE_OWN = {
    **_MESHBATCH,
    **_ORDER,
    "quick_start": (REFUSED, "a mixture needs its caches built (quick start is causal_lm's)"),
    "shuffle_per_epoch": (
        REFUSED,
        "the splice base's field; a mixture reshuffles with reshuffle_each_epoch",
    ),
}
_SPLICE_OWN = {
    **_MESHBATCH,
    "eos_id": (REFUSED, "a splice example's segments are its schedule's (the EOS variant is eos_token_id)"),
    **{
        f.name: (HONOURED, "a SpliceSpec field (docs/splice.md)")
        for f in dataclasses.fields(SpliceSpec)
        if f.name != "seq_len"
    },
    **{
        name: (HONOURED, "the document selection (select_documents)")
        for name in (
            "num_docs doc_index min_doc_length max_doc_length doc_select_mode restrict_to_training_subset "
            "max_train_batches doc_key initial_batch_size selection_seed"
        ).split()
    },
    **dict.fromkeys(
        ("validation_starts", "validation_offsets"),
        (HONOURED, "the splice validation grid (splice_validation_set)"),
    ),
    "base": (HONOURED, "the text: url_single_dataset or mixture (the splice base column)"),
    "dataset_name": (HONOURED, "the component read (a mixture base's configs key)"),
}
OWN: dict[str, dict[str, tuple[str, str]]] = {
    "causal_lm": {**_MESHBATCH, **_ORDER, "quick_start": _QUICK},
    "hf_causal_lm": {
        **_MESHBATCH,
        **_ORDER,
        "quick_start": (REFUSED, "quick start tokenizes train_urls files; build an HF source's cache first"),
    },
    "stable_mixture": {
        **_MIXTURE_OWN,
        "mixture_compat": (
            HONOURED,
            "levanter (the default): Levanter's MixtureDataset rows and component keys; exact: "
            "meshbatch's exact shares per block, components keyed by name",
        ),
    },
    "token_balanced_mixture": {**_MIXTURE_OWN, "baseline": (HONOURED, "TokenBalancedMixture baseline")},
    "splice": _SPLICE_OWN,
    "splice base": {
        "shuffle_per_epoch": (
            HONOURED,
            "unset, or the same as the splice config's shuffle_per_epoch (the row shuffle)",
        ),
    },
}


def default(config, name: str):
    """The dataclass default of ``config``'s field ``name`` (Levanter's, for Levanter's fields)."""
    f = config.__dataclass_fields__[name]
    return f.default if f.default is not dataclasses.MISSING else f.default_factory()  # type: ignore[misc]


def refuse(config, kind: str) -> None:
    """Raises ``ConfigError`` for the first refused field of ``FIELDS[kind]`` / ``OWN[kind]`` that
    ``config`` sets to anything but its dataclass default (the Levanter default), and
    ``RuntimeError`` for a field of ``config`` that neither table decides."""
    table = {**FIELDS[kind], **OWN[kind]}
    for f in dataclasses.fields(config):
        if f.name not in table:
            raise RuntimeError(
                f"{type(config).__name__}.{f.name} is neither honoured nor refused for {kind} "
                "(meshbatch.levanter.fields: decide it)"
            )
        status, why = table[f.name]
        if status != REFUSED:
            continue
        value = getattr(config, f.name)
        if value != default(config, f.name):
            raise ConfigError(f"{f.name}={value!r} is refused by {kind}: {why}")
