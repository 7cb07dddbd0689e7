"""Append-only sequences in fixed-size pages: per-node slots that never reallocate.

Why (issue 17, flat memory): the order core keeps a few 8-byte slots per node
(a lane's clocks, rounds, the confirmed positions). In one growing `list` or
`array` each resize copies the whole sequence and leaves the old block as a
hole in the C heap, so resident memory grows by several times the data. Here
each page after the first is allocated once at its full size (PAGE_SIZE
slots) and never resized: memory is the slots in use plus at most one page.

Reading slot i is `pages[i >> PAGE_SHIFT][i & PAGE_MASK]`; hot loops inline
that instead of calling `__getitem__`.
"""

from __future__ import annotations

from array import array
from collections.abc import Iterator
from typing import Generic, TypeVar

PAGE_SHIFT = 12
PAGE_SIZE = 1 << PAGE_SHIFT  # slots per page: 32 KiB of int64 or of list slots
PAGE_MASK = PAGE_SIZE - 1
# The first page starts this small and doubles up to PAGE_SIZE: a topic with
# many writers (one lane each) or many topics do not pay a full page per lane.
FIRST_PAGE_SIZE = 16

T = TypeVar("T")


class PagedList(Generic[T]):
    """An append-only list of objects in pages of PAGE_SIZE slots."""

    __slots__ = ("pages", "length")

    def __init__(self) -> None:
        self.pages: list[list[T | None]] = []
        self.length = 0

    def append(self, value: T) -> None:
        length = self.length
        if length < PAGE_SIZE:
            if not self.pages:
                self.pages.append([None] * FIRST_PAGE_SIZE)
            page = self.pages[0]
            if length == len(page):
                page.extend([None] * length)  # doubles, up to PAGE_SIZE
            page[length] = value
        else:
            slot = length & PAGE_MASK
            if slot == 0:
                self.pages.append([None] * PAGE_SIZE)
            self.pages[-1][slot] = value
        self.length = length + 1

    def __getitem__(self, index: int) -> T:
        if not 0 <= index < self.length:
            raise IndexError(index)
        return self.pages[index >> PAGE_SHIFT][index & PAGE_MASK]  # type: ignore[return-value]

    def last(self) -> T | None:
        return self[self.length - 1] if self.length else None

    def __len__(self) -> int:
        return self.length

    def __iter__(self) -> Iterator[T]:
        for index in range(self.length):
            yield self.pages[index >> PAGE_SHIFT][index & PAGE_MASK]  # type: ignore[misc]


class PagedInts:
    """An append-only sequence of int64 in pages of PAGE_SIZE slots."""

    __slots__ = ("pages", "length")

    def __init__(self) -> None:
        self.pages: list[array] = []
        self.length = 0

    def append(self, value: int) -> None:
        length = self.length
        if length < PAGE_SIZE:
            if not self.pages:
                self.pages.append(array("q", bytes(8 * FIRST_PAGE_SIZE)))
            page = self.pages[0]
            if length == len(page):
                page.frombytes(bytes(8 * length))  # doubles, up to PAGE_SIZE
            page[length] = value
        else:
            slot = length & PAGE_MASK
            if slot == 0:
                self.pages.append(array("q", bytes(8 * PAGE_SIZE)))
            self.pages[-1][slot] = value
        self.length = length + 1

    def extend(self, values) -> None:
        for value in values:
            self.append(value)

    def __getitem__(self, index: int) -> int:
        if not 0 <= index < self.length:
            raise IndexError(index)
        return self.pages[index >> PAGE_SHIFT][index & PAGE_MASK]

    def __len__(self) -> int:
        return self.length

    def __iter__(self) -> Iterator[int]:
        for index in range(self.length):
            yield self.pages[index >> PAGE_SHIFT][index & PAGE_MASK]
