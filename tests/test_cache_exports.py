"""The cache API is exported from ``meshbatch`` lazily: importing the package loads no tensorstore."""

import subprocess
import sys

import meshbatch
from meshbatch import cache


def test_top_level_names_are_the_cache_modules_objects():
    for name in sorted(meshbatch._CACHE_EXPORTS):
        assert getattr(meshbatch, name) is getattr(cache, name)


def test_importing_meshbatch_defers_tensorstore_until_a_cache_name_is_used():
    code = (
        "import sys, meshbatch\n"
        "print('tensorstore' in sys.modules)\n"
        "from meshbatch import TokenCache\n"
        "print('tensorstore' in sys.modules, TokenCache.__module__)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout.split()
    assert out == ["False", "True", "meshbatch.cache.reader"]
