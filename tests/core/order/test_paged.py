"""Paged sequences (issue 17): what goes in comes out, across the growing first page and full pages."""

from node.core.order.paged import PAGE_SIZE, PagedInts, PagedList


def test_paged_sequences_keep_every_value_in_order() -> None:
    count = 2 * PAGE_SIZE + 3
    ints, objects = PagedInts(), PagedList[str]()
    assert objects.last() is None
    for i in range(count):
        ints.append(i * 7 - 5)
        objects.append(str(i))
        assert objects.last() == str(i)
    assert len(ints) == len(objects) == count
    assert list(ints) == [i * 7 - 5 for i in range(count)]
    assert list(objects) == [str(i) for i in range(count)]
    assert ints[PAGE_SIZE] == PAGE_SIZE * 7 - 5 and objects[count - 1] == str(count - 1)
    assert len(ints.pages[0]) == PAGE_SIZE and len(ints.pages) == 3


def test_reading_past_the_end_raises() -> None:
    ints = PagedInts()
    ints.append(1)
    for index in (1, -1):
        try:
            ints[index]
        except IndexError:
            continue
        raise AssertionError(f"slot {index} was read")
