"""Range reads on an LMDB cursor: the `Store.scan` contract over one named database.

`Store.scan(table, prefix, start=, reverse=, limit=)` means "keys starting
with `prefix`, from `start` (inclusive) onwards, or downwards with
`reverse`, at most `limit` of them". LMDB cursors only offer "the first key
>= x" (`set_range`), `first`/`last` and single steps, so each direction needs
its own positioning; the reverse one is the subtle part (the last key of a
prefix range is found by seeking its upper bound and stepping back). Kept
apart from `storage.lmdb_store` so that arithmetic can be read, and tested
by the conformance suite, on its own.

Both functions copy the pairs out (py-lmdb's default `buffers=False`), so
the result stays valid after the read transaction ends.
"""

from __future__ import annotations

import lmdb

from node.core.store import prefix_upper_bound


def read_forward(
    cursor: lmdb.Cursor, prefix: bytes, start: bytes | None, limit: int | None
) -> list[tuple[bytes, bytes]]:
    """Up to `limit` pairs with `prefix`, ascending from max(prefix, start)."""
    low = prefix if start is None else max(prefix, start)
    # LMDB rejects an empty key, and b"" sorts before every key anyway.
    positioned = cursor.set_range(low) if low else cursor.first()
    if not positioned:
        return []
    pairs: list[tuple[bytes, bytes]] = []
    for key, value in cursor.iternext():
        if not key.startswith(prefix) or len(pairs) == limit:
            break
        pairs.append((key, value))
    return pairs


def read_backward(
    cursor: lmdb.Cursor, prefix: bytes, start: bytes | None, limit: int | None
) -> list[tuple[bytes, bytes]]:
    """Up to `limit` pairs with `prefix`, descending from `start` (inclusive) or the top."""
    if not _position_at_last_candidate(cursor, prefix, start):
        return []
    pairs: list[tuple[bytes, bytes]] = []
    for key, value in cursor.iterprev():
        # Walking down from the top of [prefix, bound), the first key without
        # the prefix is below the range: nothing further can match.
        if not key.startswith(prefix) or len(pairs) == limit:
            break
        pairs.append((key, value))
    return pairs


def _position_at_last_candidate(
    cursor: lmdb.Cursor, prefix: bytes, start: bytes | None
) -> bool:
    """Put the cursor on the greatest key <= start (inclusive) and < the prefix bound."""
    bound = prefix_upper_bound(prefix)
    if start is not None and (bound is None or start < bound):
        if not start:
            return False  # no key is <= b""
        if not cursor.set_range(start):
            return cursor.last()
        return cursor.key() == start or cursor.prev()
    if bound is None:
        return cursor.last()
    if not cursor.set_range(bound):
        return cursor.last()
    return cursor.prev()
