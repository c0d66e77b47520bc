"""A cache written while it is read: documents committed a few at a time by a writer thread (the
quick-start tests of the pipeline and of the Levanter fast path)."""

import threading
import time

import numpy as np

from meshbatch.cache import CacheWriter

SEQ, BATCH, ERA = 16, 8, 32
DOCS = [np.random.default_rng(i).integers(2, 5000, 40 + i % 23).astype(np.int32) for i in range(160)]
TOKENS = sum(d.size for d in DOCS)
STEPS = TOKENS // SEQ // BATCH + 4  # past the end of epoch 0, into epoch 1


class SlowWriter(threading.Thread):
    """Commits DOCS five at a time; ``commits`` holds ``(time the commit began, tokens after it)``.

    After its first commits it waits (up to a minute) for ``first_batch``: a pipeline that needed
    the finished cache would only get its first batch after that minute, and after the writer
    finished.
    """

    def __init__(self, path: str):
        super().__init__(daemon=True)
        self.path, self.commits, self.error = path, [], None
        self.opened, self.first_batch, self.finished_at = threading.Event(), threading.Event(), None

    def run(self):
        try:
            with CacheWriter(self.path, flush_tokens=1 << 30) as writer:
                self.opened.set()
                written = 0
                for i in range(0, len(DOCS), 5):
                    written += sum(d.size for d in DOCS[i : i + 5])
                    self.commits.append((time.monotonic(), written))
                    writer.write(DOCS[i : i + 5])
                    writer.flush()
                    if i == 25:
                        self.first_batch.wait(60)
                    time.sleep(0.01)
                self.commits.append((time.monotonic(), written))
            self.finished_at = time.monotonic()
        except BaseException as error:
            self.error = error
            self.opened.set()
