"""The writer pool's room (``pipelines.shard_loop._Room``): windows and bytes held at once."""
from __future__ import annotations

import threading
import time

from pipelines.shard_loop import _Held, _Room
from runtime.buffers import BufferPool


def test_the_room_holds_at_most_its_tables_and_bytes_and_one_table_alone_whatever_its_size():
    room = _Room(windows=3)
    assert room.take(10**12, timeout=0)  # no bound on bytes yet; alone
    room.give(10**12)
    room.limit = 100
    assert room.take(60, timeout=0) and room.take(40, timeout=0)
    assert not room.take(1, timeout=0.05)  # 100 bytes held
    room.give(40)
    assert room.take(30, timeout=0) and room.take(5, timeout=0)
    assert not room.take(1, timeout=0.05)  # 96 bytes would fit, a fourth window not
    room.give(60), room.give(30), room.give(5)
    assert room.held == 0 and room.bytes == 0
    assert room.take(500, timeout=0)  # over the limit, alone: taken
    assert not room.take(1, timeout=0.05)


def test_a_table_waiting_for_room_is_let_in_when_a_writer_gives_it_back():
    room = _Room(windows=16)
    room.limit = 100
    assert room.take(80, timeout=0)
    got: list[float] = []
    waiter = threading.Thread(target=lambda: got.append(room.take(50, timeout=5) and time.monotonic()))
    waiter.start()
    time.sleep(0.2)
    assert not got  # 130 > 100: waiting
    given = time.monotonic()
    room.give(80)
    waiter.join(5)
    assert got and got[0] >= given and room.bytes == 50


def test_a_window_is_held_until_the_last_of_its_pieces_is_written():
    """Its pieces are slices of one buffer: the room is given back once, after the last."""
    room = _Room(windows=16)
    room.limit = 100
    assert room.take(90, timeout=0)
    pool = BufferPool()
    lease = pool.lease()
    lease.empty((9, 10), "uint8")
    held = _Held(room, 90, pieces=3, lease=lease)
    held.written(), held.written()
    assert room.held == 1 and room.bytes == 90 and not room.take(20, timeout=0.05)
    assert pool.free == []  # the buffer is still read
    held.written()
    assert room.held == 0 and room.bytes == 0 and room.take(20, timeout=0)
    assert len(pool.free) == 1


def test_a_window_with_no_piece_to_write_is_given_back_at_once():
    """Every row of it belonged to committed shards: nothing will call ``written``."""
    room, pool = _Room(windows=3), BufferPool()
    assert room.take(90, timeout=0)
    lease = pool.lease()
    lease.empty((90,), "uint8")
    _Held(room, 90, pieces=0, lease=lease)
    assert room.held == 0 and len(pool.free) == 1
