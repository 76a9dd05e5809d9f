"""The real /dev/kmsg reader (this machine's kernel ring buffer; no Xid expected in it)."""

from __future__ import annotations

import os

import pytest

from trainwatch.exporters.node.logs.kmsg import KMSG_PATH, KmsgReader
from trainwatch.exporters.node.logs.scanner import Scanner

pytestmark = pytest.mark.skipif(not os.access(KMSG_PATH, os.R_OK),
                                reason="/dev/kmsg not readable here")


def test_reads_records_once_and_resumes_after_saved_sequence() -> None:
    scanner = Scanner()
    reader = KmsgReader(last_seq=-1)  # from the start of the ring buffer
    try:
        count = reader.poll(scanner.feed)
        seq = reader.last_seq
    finally:
        reader.close()
    if count == 0:
        pytest.skip("kernel ring buffer is empty")
    assert scanner.lines == count and seq is not None
    again = KmsgReader(last_seq=seq)  # a restart with saved state: nothing old again
    try:
        assert again.poll(scanner.feed) <= 2  # only records the kernel wrote just now
    finally:
        again.close()


def test_first_start_begins_at_the_end_of_the_buffer() -> None:
    reader = KmsgReader(last_seq=None)
    try:
        assert reader.poll(Scanner().feed) <= 2
    finally:
        reader.close()
