"""A separate process for the LMDB tests that need one (run with `python -m`).

    python -m tests.storage.lmdb_child write DATA_DIR SYNC
        Apply numbered batches forever, resuming after the last committed one,
        and print "ack N" (flushed) only after `apply` for batch N returned.
        The parent SIGKILLs it mid-stream, reopens, checks, and may start it
        again. The store starts from a tiny map, so it also grows under fire.

    python -m tests.storage.lmdb_child hold DATA_DIR
        Open the store, print "ready", keep it open until stdin closes.

The batch layout lives here so the writer and the test's checker share it.
Each batch N, in one `apply`, spanning three tables:
  - keys_in_batch(N) event records  events/   b"batch/N/i" -> value_for(N, i)
  - one count record                delivery/ b"batch/N"   -> keys_in_batch(N)
  - a moving marker                 buffer/   puts b"latest/N", deletes b"latest/N-1"
so after a crash every batch is all-or-nothing and exactly one marker exists.
Batch sizes vary so the parent's kill lands at different points of an apply
(building the transaction, writing pages, fsync).
"""

from __future__ import annotations

import sys

from storage.lmdb_store import LmdbStore
from node.core.store import TABLE_BUFFER, TABLE_DELIVERY, TABLE_EVENTS, Delete, Op, Put

MAX_KEYS_PER_BATCH = 80
VALUE_BYTES = 512  # big enough that a batch spans several pages
INITIAL_MAP_BYTES = 64 * 1024  # tiny: the map grows several times during a run
# A bound so an orphaned writer (parent gone, pipe still open) cannot run forever.
MAX_BATCHES = 1_000_000
ACK = "ack"
READY = "ready"


def keys_in_batch(batch: int) -> int:
    """1..MAX_KEYS_PER_BATCH, varying from batch to batch (37 is coprime to 80)."""
    return 1 + batch * 37 % MAX_KEYS_PER_BATCH


def event_key(batch: int, index: int) -> bytes:
    return b"batch/%08d/%03d" % (batch, index)


def count_key(batch: int) -> bytes:
    return b"batch/%08d" % batch


def marker_key(batch: int) -> bytes:
    return b"latest/%08d" % batch


def value_for(batch: int, index: int) -> bytes:
    return (b"%08d:%03d;" % (batch, index)) * (VALUE_BYTES // 13) + b"."


def batch_ops(batch: int) -> list[Op]:
    count = keys_in_batch(batch)
    ops: list[Op] = [
        Put(TABLE_EVENTS, event_key(batch, i), value_for(batch, i)) for i in range(count)
    ]
    ops.append(Put(TABLE_DELIVERY, count_key(batch), b"%d" % count))
    ops.append(Put(TABLE_BUFFER, marker_key(batch), b""))
    if batch > 0:
        ops.append(Delete(TABLE_BUFFER, marker_key(batch - 1)))
    return ops


def next_batch(store: LmdbStore) -> int:
    """The batch after the last committed one (0 for a fresh store)."""
    last = list(store.scan(TABLE_DELIVERY, b"batch/", reverse=True, limit=1))
    return int(last[0][0].split(b"/")[1]) + 1 if last else 0


def ack(batch: int) -> None:
    sys.stdout.write(f"{ACK} {batch}\n")
    sys.stdout.flush()


def write_forever(data_dir: str, sync: bool) -> None:
    store = LmdbStore(data_dir, sync=sync, map_size_bytes=INITIAL_MAP_BYTES)
    first = next_batch(store)
    for batch in range(first, first + MAX_BATCHES):
        store.apply(batch_ops(batch))
        ack(batch)
    store.close()


def hold(data_dir: str) -> None:
    store = LmdbStore(data_dir)
    sys.stdout.write(f"{READY}\n")
    sys.stdout.flush()
    sys.stdin.read()  # returns when the parent closes our stdin
    store.close()


def main(argv: list[str]) -> None:
    command, data_dir, *rest = argv
    if command == "write":
        write_forever(data_dir, sync=rest[0] == "1")
    elif command == "hold":
        hold(data_dir)
    else:
        raise SystemExit(f"unknown command {command!r}")


if __name__ == "__main__":
    main(sys.argv[1:])
