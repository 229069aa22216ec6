"""Random (version 4) UUIDs for the hot paths, from a buffer of the OS's random source.

`uuid.uuid4()` reads the OS's random source (a system call) for every id; a create makes three
(job, occurrence, request id), and the calls showed as 5% of the API's CPU under load. Here one
read serves 256 ids. The bytes are as random as uuid4()'s; a forked child starts with an empty
buffer, so parent and child never hand out the same ids.
"""

from __future__ import annotations

import os
import struct
import threading
import uuid

_IDS_PER_READ = 256
_lock = threading.Lock()
_buffer = b""
_offset = 0


def _reset() -> None:
    # A new lock too: another thread may have held the parent's at the fork.
    global _buffer, _offset, _lock
    _buffer, _offset, _lock = b"", 0, threading.Lock()


os.register_at_fork(after_in_child=_reset)


def _random_bytes(count: int) -> bytes:
    global _buffer, _offset
    with _lock:
        if _offset + count > len(_buffer):
            _buffer, _offset = os.urandom(max(count, 16 * _IDS_PER_READ)), 0
        chunk = _buffer[_offset : _offset + count]
        _offset += count
    return chunk


# What uuid.UUID(bytes=..., version=4) does to the random bits: the variant (RFC 4122) and the
# version set. Done here on the int, and the UUID built as uuid.UUID's own methods build one
# (its slots set directly): __init__'s argument checks cost ~1 us an id, and a batch create
# makes two ids a job.
_CLEAR = (0xC000 << 48) | (0xF000 << 64)
_SET = (0x8000 << 48) | (4 << 76)
_new_uuid = object.__new__
_set_slot = object.__setattr__
_SAFE_UNKNOWN = uuid.SafeUUID.unknown


def _v4(random: int) -> uuid.UUID:
    made = _new_uuid(uuid.UUID)
    _set_slot(made, "int", (random & ~_CLEAR) | _SET)
    _set_slot(made, "is_safe", _SAFE_UNKNOWN)
    return made


def new_id() -> uuid.UUID:
    """One random UUID (version 4)."""
    return _v4(int.from_bytes(_random_bytes(16)))


def new_ids(count: int) -> list[uuid.UUID]:
    """`count` random UUIDs (version 4)."""
    made: list[uuid.UUID] = []
    append, keep, new, set_slot = made.append, ~_CLEAR, _new_uuid, _set_slot
    # _v4 inlined: a call per id is a third of the cost here.
    for high, low in struct.iter_unpack(">QQ", _random_bytes(16 * count)):
        one = new(uuid.UUID)
        set_slot(one, "int", (((high << 64) | low) & keep) | _SET)
        set_slot(one, "is_safe", _SAFE_UNKNOWN)
        append(one)
    return made
