"""Following files through the handler's own rotation, and resuming from saved offsets."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest

from trainwatch.exporters.node.logs.follower import FileFollower
from trainwatch.exporters.node.logs.scanner import Scanner, Source
from trainwatch.exporters.node.logs.state_file import load_state, save_state
from trainwatch.exporters.rank.logs.handler import AsyncEcsHandler

OOM = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate %d MiB"


def collect(scanner: Scanner):
    def sink(source: Source, text: str) -> None:
        scanner.feed(source, text)
    return sink


@pytest.mark.parametrize(("pattern", "max_bytes"), [
    # Live file and backups: several rotations between two polls lose nothing.
    ("rank-2.jsonl*", 20_000),
    # Only the live name (one rotation per poll at most): the tail of the renamed file is
    # still read through the descriptor kept open since the previous poll.
    ("rank-2.jsonl", 100_000),
])
def test_follows_rotation_by_inode_without_losing_or_repeating_lines(
        tmp_path: Path, pattern: str, max_bytes: int) -> None:
    handler = AsyncEcsHandler(tmp_path, job="fjob", rank=2, max_bytes=max_bytes,
                              backup_count=50, install_signal_handler=False)
    logger = logging.getLogger(f"follow.{pattern}")
    logger.propagate = False
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    scanner = Scanner()
    follower = FileFollower([str(tmp_path / "fjob" / pattern)], {})
    total_ooms = 0
    for round_ in range(6):
        for i in range(200):
            logger.info("step %d loss=1.0", i)
        logger.error(OOM, round_)
        total_ooms += 1
        assert handler.flush(timeout=10)
        follower.poll(collect(scanner))
    handler.close()
    follower.poll(collect(scanner))
    assert handler._writer.rotations >= 3  # type: ignore[attr-defined]
    assert scanner.lines == 6 * 201
    assert scanner.events()[("fjob", "2", "cuda_oom")] == total_ooms


def test_restart_resumes_from_state_file_and_handles_truncation(tmp_path: Path) -> None:
    log = tmp_path / "train.log"
    state_path = tmp_path / "state.json"
    log.write_text("2026-11-21 INFO step 1\n2026-11-21 ERROR CUDA out of memory\n")

    def run_once() -> Scanner:
        scanner = Scanner()
        state = load_state(state_path)
        follower = FileFollower([str(tmp_path / "*.log")], state["files"], default_job="j")
        follower.poll(collect(scanner))
        follower.close()
        save_state(state_path, state)
        return scanner

    first = run_once()
    assert first.counts_by_kind()["cuda_oom"] == 1 and first.lines == 2
    with log.open("a") as handle:
        handle.write("2026-11-21 WARNING loss is nan\n2026-11-21 INFO partial line without end")
    second = run_once()  # a restarted scanner: only the new complete line
    assert second.lines == 1
    assert second.counts_by_kind()["nonfinite_loss"] == 1
    assert second.counts_by_kind()["cuda_oom"] == 0
    assert os.stat(state_path).st_mode & 0o077 == 0
    log.write_text("2026-11-21 ERROR CUDA out of memory\n")  # truncated and rewritten
    third = run_once()
    assert third.counts_by_kind()["cuda_oom"] == 1


def test_corrupt_state_file_is_refused(tmp_path: Path) -> None:
    state_path = tmp_path / "state.json"
    state_path.write_text("{not json")
    try:
        load_state(state_path)
    except ValueError as exc:
        assert "state file" in str(exc)
    else:
        raise AssertionError("corrupt state accepted")
    assert state_path.read_text() == "{not json"
