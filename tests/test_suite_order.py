"""The suite's file order (tests/support/order.py): longest files first, each file whole."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from tests.support.order import LONGEST_FIRST, longest_first

REPO = Path(__file__).resolve().parents[1]


@dataclass
class Item:
    """What longest_first reads of a pytest item."""

    nodeid: str


def test_the_listed_files_come_first_in_their_order_and_each_file_stays_whole() -> None:
    first, second = LONGEST_FIRST[0], LONGEST_FIRST[1]
    items = [Item(n) for n in (
        "tests/a/test_many.py::t1", "tests/a/test_many.py::t2", "tests/a/test_many.py::t3",
        f"{second}::s1", "tests/b/test_one.py::o1", f"{first}::f1", f"{second}::s2",
        f"{first}::f2")]
    longest_first(items)  # type: ignore[arg-type]
    assert [i.nodeid for i in items] == [
        f"{first}::f1", f"{first}::f2", f"{second}::s1", f"{second}::s2",
        "tests/a/test_many.py::t1", "tests/a/test_many.py::t2", "tests/a/test_many.py::t3",
        "tests/b/test_one.py::o1"]


def test_every_listed_file_exists() -> None:
    missing = [name for name in LONGEST_FIRST if not (REPO / name).is_file()]
    assert missing == [], f"tests/support/order.py names files that are gone: {missing}"
