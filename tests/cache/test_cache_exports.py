"""The cache API is exported from ``meshbatch`` lazily: importing the package loads no tensorstore."""

import subprocess
import sys

import meshbatch
from meshbatch import cache


def test_top_level_names_are_the_cache_modules_objects():
    names = sorted(name for name, module in meshbatch._EXPORTS.items() if module == "meshbatch.cache")
    assert {"TokenCache", "CacheWriter", "build_cache", "validate_cache"} <= set(names)
    for name in names:
        assert getattr(meshbatch, name) is getattr(cache, name)


def test_every_public_name_resolves():
    for name in meshbatch.__all__:
        assert getattr(meshbatch, name) is not None, name


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
    assert out == ["False", "True", "meshbatch.cache.read.reader"]
