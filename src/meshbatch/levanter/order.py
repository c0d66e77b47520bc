"""A run's data order: what the start line names, what each checkpoint records, what a resume checks.

The order is a JSON record whose fields are the YAML lines that give it, so a mismatch names
the line to add::

    {"config": "mixture", "mixture_compat": "levanter", "mixture_block_size": 2048,
     "stop_strategy": "restart", "components": ["web", "code"],
     "train_weights": [[0, {"web": 0.7, "code": 0.3}]], "data_key": "0000000000000000",
     "sources": {"web": {"shuffle": true, "permutation_type": "linear", "compat": "levanter"}, ...}}

A Levanter config (no meshbatch ``type:``) run through ``meshbatch.levanter.train_lm`` gets the
same record (``levanter_order``), so a block trained with and without ``type:`` records the same
order. Each checkpoint holds it as ``meshbatch_data_order.json`` (``fast.write_data``); a resume
compares it with the run's own (``check``): another order is refused by name, with the lines to
add; a checkpoint without one was written by Levanter's own loader (or meshbatch before these
records), so its order is Levanter's: a run asking for another (``compat: strong``,
``mixture_compat: exact``, meshbatch's own dataset kinds) is refused, naming the lines that give
Levanter's. ``MESHBATCH_DATA_ORDER_CHECK=off`` resumes without the check (a WARNING line): for a
checkpoint of meshbatch before these records, trained under its then-default orders.

A chat or supervised source (``PackedDataset`` rows in Levanter's packing) adds the fields that
give its rows (``packed_order``): ``{"shuffle": true, ..., "format": "chat", "pack": true}``.

Beside the order, the record holds the train set's content fingerprint
(``Pipeline.content_fingerprint()``: the components, their caches' identities, the weights). A
resume whose fingerprint differs (a re-bucketed corpus, a rewritten or moved cache) is not
refused: it logs a WARNING naming both fingerprints (``check_content``). The order check already
refuses another order, seed, components or weights; the fingerprint also changes when a cache is
legitimately copied to another bucket or rewritten, which a long run must be able to continue, so
it is said loudly, not blocked.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Mapping, Sequence

import jax
import numpy as np

from meshbatch.arguments import as_key
from meshbatch.shuffles.shuffle_spec import ShuffleSpec

logger = logging.getLogger(__name__)
ORDER_FILE = "meshbatch_data_order.json"
ORDER_VERSION = 2  # 2: a packed source's record names its packing (packed_order); 1 did not
LEVANTER_KINDS = ("single source", "mixture")  # the configs Levanter's own loader trains
TOP_LINES = ("mixture_compat", "mixture_block_size", "stop_strategy", "train_weights", "baseline")


class DataOrderMismatch(ValueError):
    """Resuming a checkpoint under another data order than the one it was trained in."""


def source_order(spec: ShuffleSpec) -> dict:
    """A source's order as the YAML fields that give it (Levanter's spelling: ``shuffle: n`` for
    an era of ``n``); an unshuffled source is ``{"shuffle": false}`` whatever ``compat`` says."""
    if spec.strategy == "none":
        return {"shuffle": False}
    shuffle = {"full": True, "era": spec.era_length, "block": "block"}[spec.strategy]
    out = {"shuffle": shuffle, "permutation_type": spec.kind,
           "compat": "levanter" if spec.compat == "levanter" else "strong"}  # fmt: skip
    if spec.strategy == "block":
        out |= {"io_block_size": spec.io_block_size, "window_blocks": spec.window_blocks}
    if spec.reshuffle_each_epoch:
        out["reshuffle_each_epoch"] = True
    return out


def levanter_source_order(shuffle, permutation_type) -> dict:
    """The order Levanter's own ``train_set`` gives a source of ``shuffle`` (``source_order``'s
    record of the same order: ``shuffle: true`` is ``linear`` unless ``permutation_type`` says)."""
    if shuffle is False or shuffle is None or (not isinstance(shuffle, bool) and shuffle <= 0):
        return {"shuffle": False}
    return {"shuffle": shuffle, "permutation_type": permutation_type or "linear", "compat": "levanter"}


def packed_order(fmt) -> dict:
    """The fields a source's ``format`` adds to its order: nothing for text (its windows); a chat
    or supervised format's packed examples (``{"format": "chat", "pack": true}``: which examples
    share a row; single-turn chat packs as supervised, as Levanter packs it)."""
    from levanter.data.text import ChatLmDatasetFormat, SupervisedLmDatasetFormat

    if isinstance(fmt, ChatLmDatasetFormat):
        return {"format": "supervised" if fmt.single_turn else "chat", "pack": bool(fmt.pack)}
    if isinstance(fmt, SupervisedLmDatasetFormat):
        return {"format": "supervised", "pack": bool(fmt.pack)}
    return {}


def family(source: Mapping) -> str:
    """``cache order`` (unshuffled: Levanter's and meshbatch's alike), ``levanter`` or ``strong``."""
    return "cache order" if source.get("shuffle") is False else str(source.get("compat"))


def key_hex(key) -> str:
    """The data key's bits, hex (typed, raw ``uint32[2]`` or an int seed)."""
    return np.asarray(jax.random.key_data(as_key(key)), dtype=np.uint32).tobytes().hex()


def stages(train_weights, names: Sequence[str]) -> list:
    """``train_weights`` as ``[[start, {name: weight}], ...]`` over the built ``names``."""
    staged = [(0, train_weights)] if isinstance(train_weights, Mapping) else train_weights
    return [[int(at), {n: float(w) for n, w in weights.items() if n in names}] for at, weights in staged]


def levanter_order(config, key) -> dict | None:
    """The record of Levanter's own config ``config`` (``None`` for another class)."""
    from levanter.data.text import LMMixtureDatasetConfig, SingleDatasetLMConfigBase

    if isinstance(config, LMMixtureDatasetConfig):
        staged = stages(config.train_weights, list(config.configs))
        names = [n for n in config.configs if any(w.get(n, 0) > 0 for _, w in staged)]
        source = levanter_source_order(config.shuffle, config.permutation_type)
        rows = {"mixture_compat": "levanter", "mixture_block_size": config.mixture_block_size,
                "stop_strategy": str(config.stop_strategy),
                "train_weights": stages(config.train_weights, names)}  # fmt: skip
        return normal(mixture(names, source, config.configs) | rows | {"data_key": key_hex(key)})
    if isinstance(config, SingleDatasetLMConfigBase):
        source = levanter_source_order(config.shuffle, config.permutation_type) | packed_order(config.format)
        return normal({"config": "single source", "data_key": key_hex(key), "sources": {"": source}})
    return None


def mixture(names: Sequence[str], source: dict, configs: Mapping) -> dict:
    """A mixture's record over the built components ``names``, each in the order ``source`` and
    its ``configs[name].format``'s packing."""
    return {"config": "mixture", "components": list(names),
            "sources": {n: source | packed_order(configs[n].format) for n in names}}  # fmt: skip


def normal(record: dict) -> dict:
    """``record`` as JSON reads it back (tuples as lists, numbers as JSON's)."""
    return json.loads(json.dumps(record, default=str))


def is_levanters(record: Mapping) -> bool:
    """Whether Levanter's own loader gives this order (a single source or a mixture, Levanter's
    permutations and mixture rows)."""
    sources = record.get("sources", {}).values()
    return (
        record.get("config") in LEVANTER_KINDS
        and record.get("mixture_compat", "levanter") == "levanter"
        and all(family(s) in ("cache order", "levanter") and s.get("shuffle") != "block" for s in sources)
        and not any(s.get("reshuffle_each_epoch") for s in sources)
    )


def _yaml(value) -> str:
    return json.dumps(value) if not isinstance(value, str) else value


def differences(saved: Mapping, now: Mapping) -> tuple[list[str], list[str]]:
    """What differs (``field: checkpoint X, this run Y``) and the lines that give the checkpoint's."""
    what, lines = [], []

    def note(path: str, a, b, line: str | None) -> None:
        what.append(f"{path}: checkpoint {_yaml(a)}, this run {_yaml(b)}")
        if line and line not in lines:
            lines.append(line)

    if saved.get("config") != now.get("config"):
        note("config", saved.get("config"), now.get("config"), None)
        return what, lines
    for name in sorted((set(saved) | set(now)) - {"config", "sources"}):
        if saved.get(name) == now.get(name):
            continue
        line = {
            "data_key": "the checkpoint's trainer.seed (or data_seed)",
            "components": f"the checkpoint's components (positive weights): {_yaml(saved.get(name))}",
        }.get(name, f"{name}: {_yaml(saved.get(name))}" if name in TOP_LINES or name in saved else None)
        note(name, saved.get(name), now.get(name), line)
    for source in sorted(set(saved.get("sources", {})) | set(now.get("sources", {}))):
        a, b = saved.get("sources", {}).get(source, {}), now.get("sources", {}).get(source, {})
        where = f"sources[{source!r}]." if source else ""
        for field in [f for f in dict.fromkeys([*a, *b]) if a.get(f) != b.get(f)]:
            shuffled = a.get("shuffle") != b.get("shuffle")
            line = f"{field}: {_yaml(a[field])}" if field in a else None
            if field not in a and not shuffled:
                line = f"drop {field} (the checkpoint's order has none)"
            note(f"{where}{field}", a.get(field), b.get(field), line)
    return what, lines


def with_packing(saved: Mapping, now: Mapping, where: str) -> dict:
    """A version-1 record (written before records named a packed source's packing): each of its
    sources takes the packing fields of the same source now. Its chat/supervised sources were
    trained in Levanter's packing of the same ``format`` (Levanter's own packed dataset), which is
    what a packed source trains now; said at INFO."""
    saved = normal(saved)
    filled = []
    for name, source in saved.get("sources", {}).items():
        packing = {k: v for k, v in now.get("sources", {}).get(name, {}).items() if k in ("format", "pack")}
        if packing and not any(k in source for k in packing):
            source.update(packing)
            filled.append(name or "default")
    if filled:
        logger.info(
            "meshbatch: the checkpoint %s's data-order record predates packing fields: its sources %s "
            "are taken to be packed as this run packs them (Levanter's packing of the same format)",
            where, filled,
        )  # fmt: skip
    return saved


def check(saved: Mapping | None, now: Mapping, where: str, *, version: int = ORDER_VERSION) -> None:
    """Refuse resuming ``where`` (a checkpoint whose record is ``saved``, ``None`` when it has
    none; ``version``: its file's, see ``with_packing``) under the order ``now``;
    ``MESHBATCH_DATA_ORDER_CHECK=off`` logs instead."""
    if saved is not None:
        if version < 2:
            saved = with_packing(saved, normal(now), where)
        what, lines = differences(normal(saved), normal(now))
        if not what:
            logger.info("meshbatch: the checkpoint %s was trained in this run's data order", where)
            return
        message = (
            f"the checkpoint {where} was trained in another data order than this run's: "
            + "; ".join(what)
            + (". To continue its order, set under data: " + "; ".join(lines) if lines else "")
        )
    elif is_levanters(now):
        logger.info(
            "meshbatch: the checkpoint %s has no %s (written by Levanter's own loader): resuming in "
            "Levanter's order, which this run's is", where, ORDER_FILE,
        )  # fmt: skip
        return
    else:
        fixes = sorted({f"{k}: levanter" for s in now.get("sources", {}).values()
                        for k in ("compat",) if family(s) == "strong"})  # fmt: skip
        if now.get("mixture_compat", "levanter") != "levanter":
            fixes.append("mixture_compat: levanter")
        if any(s.get("shuffle") == "block" for s in now.get("sources", {}).values()):
            fixes.append("shuffle: true, false or an era length (Levanter has no block shuffle)")
        if any(s.get("reshuffle_each_epoch") for s in now.get("sources", {}).values()):
            fixes.append("reshuffle_each_epoch: false")
        if now.get("config") not in LEVANTER_KINDS:
            fixes.append(f"a Levanter-trainable config (not {now.get('config')})")
        message = (
            f"the checkpoint {where} has no {ORDER_FILE}: it was written by Levanter's own loader "
            "(or by meshbatch before data-order records), so it was trained in Levanter's order, and "
            f"this run's is another. To continue it, set under data: {'; '.join(fixes)}"
        )
    if os.environ.get("MESHBATCH_DATA_ORDER_CHECK", "on") == "off":
        logger.warning("meshbatch: MESHBATCH_DATA_ORDER_CHECK=off, resuming anyway: %s", message)
        return
    raise DataOrderMismatch(
        message + " (MESHBATCH_DATA_ORDER_CHECK=off resumes without this check: a checkpoint of "
        "meshbatch before data-order records trained in its own orders)"
    )


def check_content(saved: str | None, now: str | None, where: str) -> bool:
    """Compare the content fingerprint recorded with the checkpoint ``where`` (``saved``) with this
    run's (``now``): ``True`` when equal; otherwise a WARNING naming both (not a refusal: see the
    module docstring) and ``False``. Either missing (a checkpoint of Levanter's own loader or of
    meshbatch before fingerprints; a Levanter config run without ``type:``) is said at INFO."""
    if saved is not None and now is not None and saved == now:
        logger.info("meshbatch: the checkpoint %s was trained on this content (fingerprint %s)", where, now)
        return True
    if saved is None or now is None:
        logger.info(
            "meshbatch: no content fingerprint to compare (checkpoint %s: %s, this run: %s)",
            where, saved, now,
        )  # fmt: skip
        return False
    logger.warning(
        "meshbatch: the checkpoint %s was trained on other content: content fingerprint %s in the "
        "checkpoint, %s in this run (a re-bucketed corpus, a replaced or moved cache, other "
        "components or weights); resuming in the same data order over this content: the rows from here "
        "on may differ from those the checkpoint's run would have trained on",
        where, saved, now,
    )  # fmt: skip
    return False


def describe(record: Mapping) -> tuple[str, dict[str, str]]:
    """The order for the start line (``levanter {shuffle: true, permutation_type: linear}``; a
    mixture's rows first), and each source's."""
    per_source = {
        name or "default": f"{family(s)} {json.dumps(s, separators=(', ', ': '))}"
        for name, s in record.get("sources", {}).items()
    }
    config = record.get("config")
    if config == "single source":
        return next(iter(per_source.values()), "?"), per_source
    if config == "mixture":
        head = (
            f"mixture={record.get('mixture_compat')} (block {record.get('mixture_block_size')}, "
            f"{record.get('stop_strategy')}, {len(record.get('components', []))} components)"
        )
    elif config == "token_balanced_mixture":
        head = f"token_balanced (baseline {record.get('baseline')})"
    else:
        return f"{config} schedule (meshbatch's own)", per_source
    return head + " sources: " + "; ".join(f"{n}={d}" for n, d in per_source.items()), per_source
