"""The cache the object-store build tests build: 120 documents written in 6 commits::

    built = []
    build = slow_build(docs(), built, pause=0.15)   # build(target): ~1 s, appends target to built

(``gate``: the build stops after its first commit until the test sets the event.)
"""

import time

import numpy as np

from meshbatch.cache import CacheWriter


def docs(n: int = 120, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [np.append(rng.integers(2, 30_000, rng.integers(5, 60)), 1).astype(np.int32) for _ in range(n)]


def slow_build(rows: list[np.ndarray], built: list[str], *, pause: float = 0.15, gate=None):
    """A ``build(target)`` writing ``rows`` in 6 commits ``pause`` s apart (``gate``: an Event
    waited on, at most 30 s, after the first commit)."""

    def build(target: str) -> None:
        built.append(target)
        step = -(-len(rows) // 6)
        with CacheWriter(target, if_exists="overwrite", flush_tokens=1 << 30) as writer:
            for i in range(0, len(rows), step):
                writer.write(rows[i : i + step])
                writer.flush()
                if gate is not None and i == 0:
                    assert gate.wait(30), "the test never opened the gate"
                time.sleep(pause)

    return build
