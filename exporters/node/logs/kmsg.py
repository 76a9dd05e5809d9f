"""Read the kernel log from /dev/kmsg, where the NVIDIA driver reports Xid errors.

Each read() returns one record, "prio,seq,usec,flags;message". Sequence numbers let a
restarted scanner skip records it already counted. On the very first start (no saved
sequence number) reading begins at the end of the ring buffer, so a reboot-old Xid is not
counted again by every new scanner.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Callable

from trainwatch.exporters.node.logs.scanner import Source

KMSG_PATH = "/dev/kmsg"
KERNEL_SOURCE = Source(name="kernel", kernel=True)


class KmsgReader:
    """Non-blocking reader of /dev/kmsg records."""

    def __init__(self, last_seq: int | None, path: str = KMSG_PATH) -> None:
        self.path = path
        self.last_seq = last_seq
        self._fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
        if last_seq is None:
            os.lseek(self._fd, 0, os.SEEK_END)

    def poll(self, sink: Callable[[Source, str], None]) -> int:
        lines: list[str] = []
        while True:
            try:
                record = os.read(self._fd, 8192)
            except BlockingIOError:
                break
            except OSError as exc:
                if exc.errno == errno.EPIPE:  # records were overwritten before we read them
                    continue
                raise
            if not record:
                break
            header, _, message = record.decode("utf-8", "replace").partition(";")
            fields = header.split(",")
            try:
                seq = int(fields[1])
            except (IndexError, ValueError):
                continue
            if self.last_seq is not None and seq <= self.last_seq:
                continue
            self.last_seq = seq
            lines.append(message.split("\n", 1)[0])
        if lines:
            sink(KERNEL_SOURCE, "\n".join(lines) + "\n")
        return len(lines)

    def close(self) -> None:
        os.close(self._fd)
