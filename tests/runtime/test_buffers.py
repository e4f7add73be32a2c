"""``runtime.buffers``: the output windows' buffers, reused once released."""
from __future__ import annotations

import numpy as np

from runtime.buffers import HEADROOM, BufferPool


def test_a_released_buffer_is_the_next_windows_and_the_smallest_that_fits_is_taken():
    pool = BufferPool(keep=4)
    a, b = pool.lease(), pool.lease()
    x = a.empty((1000, 4), np.float16)  # 8,000 bytes
    y = b.empty((10, 3, 4), "float32")  # 480 bytes
    assert x.shape == (1000, 4) and x.dtype == np.float16 and y.shape == (10, 3, 4) and y.dtype == np.float32
    x[:] = 1
    a.release(), b.release()
    assert pool.made == 2 and sorted(f.nbytes for f in pool.free) == [480 + 480 // HEADROOM, 8000 + 8000 // HEADROOM]
    c = pool.lease()
    small = c.empty((100,), np.float32)  # 400 bytes: the 480-byte buffer, not the 8,000
    big = c.empty((1010, 4), np.float16)  # 8,080 bytes: within the 8,000's headroom
    assert pool.made == 2 and pool.free == []
    assert np.shares_memory(big, x) and not np.shares_memory(small, x)
    assert (big[:1000] == 1).all()  # np.empty's contract: whatever the buffer held
    c.release()
    d = pool.lease()
    d.empty((9000,), np.uint8)  # larger than any: a new buffer
    assert pool.made == 3


def test_the_pool_keeps_its_largest_buffers_and_a_release_gives_each_back_once():
    pool = BufferPool(keep=2)
    leases = [pool.lease() for _ in range(4)]
    for k, lease in enumerate(leases):
        lease.empty((100 * (k + 1),), np.uint8)
    for lease in leases:
        lease.release()
    leases[0].release()  # again: nothing left to give
    assert [f.nbytes for f in pool.free] == [300 + 300 // HEADROOM, 400 + 400 // HEADROOM]
    empty = pool.lease().empty((0, 1024), np.float16)
    assert empty.shape == (0, 1024)


def test_a_small_window_does_not_take_a_buffer_over_twice_its_size():
    """The writer's room counts a lease's buffers (``Lease.nbytes``); a file's last, small window
    gets a small buffer of its own rather than a full window's."""
    pool = BufferPool()
    big = pool.lease()
    big.empty((1 << 20,), np.uint8)
    big.release()
    small = pool.lease()
    small.empty((1000,), np.uint8)
    assert pool.made == 2 and small.nbytes == 1000 + 1000 // HEADROOM
    half = pool.lease()
    half.empty((600_000,), np.uint8)  # 1 MiB + 1/16 is under twice 600,000
    assert pool.made == 2 and half.nbytes == (1 << 20) + (1 << 20) // HEADROOM
