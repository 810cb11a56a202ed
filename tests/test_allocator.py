"""The allocator setting of :mod:`axoplan.allocator`: applied on glibc Linux, never over the user's own."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.conftest import REPO

PROBE = """
from axoplan.allocator import keep_freed_memory
applied = keep_freed_memory()
import numpy as np
# with the thresholds raised, a freed 1 MB block stays in the heap: the next one reuses its address
a = np.empty(1 << 17); first = a.ctypes.data; del a
b = np.empty(1 << 17)
print(applied, b.ctypes.data == first)
"""

glibc = pytest.mark.skipif(not sys.platform.startswith("linux") or not os.confstr("CS_GNU_LIBC_VERSION"),
                           reason="glibc's mallopt only")


def _probe(**malloc_env: str) -> list[str]:
    """The probe's (applied, reused) in a process whose only MALLOC_ variables are `malloc_env`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")} | malloc_env
    out = subprocess.run([sys.executable, "-c", PROBE], env=env, cwd=REPO, capture_output=True, text=True,
                         check=True)
    return out.stdout.split()


@glibc
def test_thresholds_are_raised_and_freed_blocks_stay_in_the_heap() -> None:
    assert _probe() == ["True", "True"]  # with glibc's defaults the address differs (the block was unmapped)


@glibc
def test_a_threshold_the_user_set_is_left_alone() -> None:
    assert _probe(MALLOC_TRIM_THRESHOLD_="131072")[0] == "False"
