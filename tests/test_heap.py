"""The supervisor's heap trim: real on glibc, a no-op elsewhere."""

import platform

import pytest

from ddptop.supervisor import heap


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="malloc_trim is glibc's")
def test_trim_reaches_glibc_malloc_trim():
    garbage = [bytes(4096) for _ in range(20_000)]  # 80 MiB in small blocks, then freed
    del garbage
    assert heap.trim()
