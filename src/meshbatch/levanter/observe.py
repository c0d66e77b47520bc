"""meshbatch at work, in Levanter's log and tracker.

* ``start(...)``: one INFO line when a train set is made (dataset type, the order family and
  fields of each source and of the mixture, the loader and why, the builder, each cache found or
  built, the train set's content fingerprint) and the same facts as the tracker's summary
  (``meshbatch/...``; json_logger writes them as a ``summary`` event).
* ``StepMetrics``: at the stream's first step and every ``every`` steps of the fast path, per
  source the rows and tokens read so far (the cache's ``ReadCounters``: a causal window is one
  span), reads issued per row read, and every field of the ``Pipeline``'s ``stats()`` since the
  last report (``Pipeline.reset_stats`` after each) as ``data/meshbatch/<key>`` metrics of that step::

    step 9: data/meshbatch/default/rows=48, data/meshbatch/wait_p99_s=0.0004,
            data/meshbatch/stall_fraction=0.01, data/meshbatch/requests_per_example=0.25, ...

    meshbatch: data type=causal_lm order=levanter {"shuffle": true, "permutation_type": "linear",
        "compat": "levanter"} loader=fast path (meshbatch.Pipeline ...) cache_builder=in_process
        caches={'': 'found (cache/owt/train)'} content_fingerprint=9a0c...
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Mapping

logger = logging.getLogger(__name__)
CACHE_STATUS: dict[str, str] = {}  # cache path -> "found" | "built" (this process)
FAST = "fast path"  # the loader of a MeshbatchDataset inside the entry point (PipelineLoader)
LEVANTER_LOADER = "Levanter's DataLoader"


def _tracker(method: str, *args, **kwargs) -> None:
    import levanter.tracker

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # no tracker outside a trainer: nothing to log to
        try:
            getattr(levanter.tracker, method)(*args, **kwargs)
        except RuntimeError as error:  # Levanter's "No global tracker set"
            logger.debug("meshbatch: not logged to a tracker: %s", error)


def start(
    kind: str,
    record: Mapping,
    *,
    loader: str,
    why: str,
    builder: str,
    caches: Mapping[str, str],
    fingerprint: str | None = None,
) -> None:
    """The start line and summary: the data ``record`` (``order.py``: each source's order family
    and fields, the mixture's), the loader path and why, the builder, each cache's state
    (``caches`` maps a source name to its cache path) and the train set's content ``fingerprint``
    (``Pipeline.content_fingerprint()``; ``None``: not a meshbatch dataset, not said)."""
    from .order import describe

    status = {name: f"{CACHE_STATUS.get(path, 'found')} ({path})" for name, path in caches.items()}
    order, per_source = describe(record)
    logger.info(
        "meshbatch: data type=%s order=%s loader=%s (%s) cache_builder=%s caches=%s%s",
        kind, order, loader, why, builder, status,
        "" if fingerprint is None else f" content_fingerprint={fingerprint}",
    )  # fmt: skip
    summary = {"meshbatch/type": kind, "meshbatch/order": order, "meshbatch/loader": loader,
               "meshbatch/loader_why": why, "meshbatch/fast_path": loader == FAST,
               "meshbatch/cache_builder": builder}  # fmt: skip
    if fingerprint is not None:
        summary["meshbatch/content_fingerprint"] = fingerprint
    if "mixture_compat" in record:
        summary["meshbatch/mixture_order"] = str(record["mixture_compat"])
    summary.update({f"meshbatch/order/{name}": text for name, text in per_source.items()})
    summary.update({f"meshbatch/cache/{name or 'default'}": s for name, s in status.items()})
    _tracker("log_summary", summary)


class StepMetrics:
    """Per-source consumption, reads per example and the pipeline's stats, every ``every`` steps."""

    def __init__(self, sources: Mapping[str, object], *, every: int):
        self.sources, self.every = dict(sources), every

    def metrics(self, pipeline) -> dict[str, float]:
        """The metrics of one report; ``pipeline`` is the ``Pipeline`` the fast path streams from
        (its ``stats()`` are forwarded key for key, then reset for the next report's window)."""
        out: dict[str, float] = {}
        rows = reads = 0
        for name, cache in self.sources.items():
            counters, tag = cache.counters, name or "default"
            out[f"data/meshbatch/{tag}/rows"] = counters.spans_requested
            out[f"data/meshbatch/{tag}/tokens"] = counters.bytes_read // cache.dtype.itemsize
            rows, reads = rows + counters.spans_requested, reads + counters.reads_issued
        out["data/meshbatch/reads_per_example"] = reads / max(rows, 1)
        out.update({f"data/meshbatch/{key}": value for key, value in pipeline.stats().items()})
        pipeline.reset_stats()
        return out

    def after(self, step: int, pipeline, *, first: bool = False) -> None:
        """Logs the metrics at ``step`` when it is a reporting step: the stream's ``first`` step
        (so a short run shows them too) and every ``every``-th."""
        if self.every > 0 and self.sources and (first or (step + 1) % self.every == 0):
            _tracker("log", self.metrics(pipeline), step=step)
