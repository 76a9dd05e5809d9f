"""Scanner classification on real-format lines of every class, and lines that must not match."""

from __future__ import annotations

import json

import pytest

from trainwatch.exporters.contract.catalog import LOG_EVENT_KINDS
from trainwatch.exporters.node.logs.scanner import Scanner, Source

SOURCE = Source(name="test", job="llm", rank="0")


def scan(text: str, source: Source = SOURCE) -> Scanner:
    scanner = Scanner()
    scanner.feed(source, text)
    return scanner


def kinds(text: str) -> dict[str, int]:
    return {k: v for k, v in scan(text).counts_by_kind().items() if v}


# One real-format example per class, as the frameworks print them.
POSITIVE = [
    ("cuda_oom", "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 "
     "has a total capacity of 79.11 GiB of which 1.20 GiB is free. Including non-PyTorch memory, "
     "this process has 77.90 GiB memory in use."),
    ("cuda_oom", "RuntimeError: CUDA error: out of memory"),
    ("nccl_timeout", "[rank0]:[E1218 20:27:21.426415540 ProcessGroupNCCL.cpp:629] [Rank 0] "
     "Watchdog caught collective operation timeout: WorkNCCL(SeqNum=1, OpType=BROADCAST, "
     "NumelIn=131072000, NumelOut=131072000, Timeout(ms)=600000) ran for 600081 milliseconds "
     "before timing out."),
    ("nccl_timeout", "[E ProcessGroupNCCL.cpp:475] [Rank 1] Watchdog caught collective operation"
     " timeout: WorkNCCL(SeqNum=668, OpType=ALLREDUCE, NumelIn=52, NumelOut=52, "
     "Timeout(ms)=1800000) ran for 1800097 milliseconds before timing out."),
    ("nccl_error", "torch.distributed.DistBackendError: NCCL error in: ../torch/csrc/distributed/"
     "c10d/ProcessGroupNCCL.cpp:1970, unhandled system error (run with NCCL_DEBUG=INFO for "
     "details), NCCL version 2.19.3"),
    ("nccl_error", "ncclInternalError: Internal check failed."),
    ("elastic_child_failed", "E1121 10:31:02.123000 4242 torch/distributed/elastic/"
     "multiprocessing/api.py:869] failed (exitcode: 1) local_rank: 0 (pid: 4243) of binary: "
     "/usr/bin/python3"),
    ("elastic_child_failed", "torch.distributed.elastic.multiprocessing.errors.ChildFailedError:"),
    ("rendezvous_timeout", "torch.distributed.elastic.rendezvous.api.RendezvousTimeoutError"),
    ("rendezvous_timeout", "torch.distributed.DistStoreError: Timed out after 901 seconds waiting"
     " for clients. 1/2 clients joined."),
    ("nonfinite_loss", "2026-11-21 10:30:30 WARNING Loss became nan at step 7"),
    ("nonfinite_loss", "step 120 | loss=nan | lr=3e-4"),
    ("nonfinite_loss", "Epoch 3: loss: inf"),
    ("nonfinite_loss", "Rank 3: found NaN in local forward loss calculation. Device: 3, node: "
     "gpu-7"),
    ("nonfinite_loss", "ValueError: Detected nan and/or inf values in `layer.weight`. Check your"
     " forward pass for numerically unstable operations."),
    ("nonfinite_loss", "RuntimeError: Function 'MulBackward0' returned nan values in its 0th "
     "output."),
    ("nonfinite_loss", "RuntimeError: The total norm of order 2.0 for gradients from "
     "`parameters` is non-finite, so it cannot be clipped."),
    ("nonfinite_loss", "grad norm is nan, skipping step"),
    ("nonfinite_loss", "Monitored metric val_loss = nan is not finite. Previous best value was "
     "0.412. Signaling Trainer to stop."),
    ("xid", "[ 9012.345678] NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python, GPU has "
     "fallen off the bus."),
]

NEGATIVE = [
    "2026-11-21 10:30:31 INFO step=5 loss=0.0nan_guard",  # a loss value that is not NaN
    "2026-11-21 10:30:31 INFO hang_detector_timeout=30 change_hang_threshold=2",  # "hang"
    "2026-11-21 10:30:25 INFO Step 1: loss=1.234, lr=1e-4, time=0.5s",
    "2026-11-21 10:30:25 INFO NCCL_DEBUG=INFO NCCL_ASYNC_ERROR_HANDLING=1 configured",
    "[2026-11-21 10:30:25,001] [INFO] [deepspeed] OVERFLOW! Rank 0 Skipping step. Attempted "
    "loss scale: 65536, reducing to 32768",  # routine fp16 loss scaling
    "2026-11-21 10:30:25 INFO memory_allocated=12.3GiB max_memory_reserved=70.1GiB",
    "2026-11-21 10:30:25 INFO using torch.nan_to_num on logits; inference mode",
    "2026-11-21 10:30:25 INFO rendezvous complete for run llm, world_size=8",
    "2026-11-21 10:30:25 INFO worker exitcode 0, restarting in 5s",
]


@pytest.mark.parametrize(("kind", "line"), POSITIVE)
def test_real_messages_are_classified(kind: str, line: str) -> None:
    assert kinds(line + "\n") == {kind: 1}


@pytest.mark.parametrize("line", NEGATIVE)
def test_ordinary_lines_do_not_match(line: str) -> None:
    assert kinds(line + "\n") == {}


def test_every_catalog_class_has_a_positive_example() -> None:
    assert {kind for kind, _ in POSITIVE} == set(LOG_EVENT_KINDS)


OOM_TRACEBACK = '''\
2026-11-21 10:30:30 ERROR step 42 failed
Traceback (most recent call last):
  File "/opt/train/train.py", line 210, in step
    """Run one step; on CUDA out of memory the caller retries with a smaller batch."""
  File "/opt/venv/lib/python3.11/site-packages/torch/nn/modules/module.py", line 1736, in _call
    return forward_call(*args, **kwargs)
torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total \
capacity of 79.11 GiB of which 1.20 GiB is free.
2026-11-21 10:30:31 INFO step 43 loss=1.234
'''


def test_traceback_with_oom_in_a_docstring_line_counts_once() -> None:
    assert kinds(OOM_TRACEBACK) == {"cuda_oom": 1}


def test_oom_only_in_source_line_of_a_traceback_counts_nothing() -> None:
    text = OOM_TRACEBACK.replace("torch.OutOfMemoryError: CUDA out of memory.", "ValueError: bad.")
    assert kinds(text) == {}


def test_two_separate_failures_count_twice() -> None:
    assert kinds(OOM_TRACEBACK + OOM_TRACEBACK) == {"cuda_oom": 2}


def test_traceback_split_across_reads_still_counts_once() -> None:
    scanner = Scanner()
    middle = OOM_TRACEBACK.index("torch.OutOfMemoryError")
    scanner.feed(SOURCE, OOM_TRACEBACK[:middle])
    scanner.feed(SOURCE, OOM_TRACEBACK[middle:])
    scanner.feed(SOURCE, "2026-11-21 10:30:40 ERROR CUDA out of memory again\n")
    assert scanner.counts_by_kind()["cuda_oom"] == 2


def test_multiline_nccl_error_and_elastic_summary_count_once() -> None:
    text = """\
[rank1]: Traceback (most recent call last):
[rank1]:   File "/opt/train/train.py", line 88, in <module>
[rank1]:     dist.all_reduce(t)
[rank1]: torch.distributed.DistBackendError: NCCL error in: ../torch/csrc/distributed/c10d/\
ProcessGroupNCCL.cpp:1970, unhandled system error (run with NCCL_DEBUG=INFO for details), \
NCCL version 2.19.3
[rank1]: ncclSystemError: System call (e.g. socket, malloc) or external library call failed \
or device error.
E1121 10:31:02.123000 4242 torch/distributed/elastic/multiprocessing/api.py:869] failed \
(exitcode: 1) local_rank: 1 (pid: 4243) of binary: /usr/bin/python3
Traceback (most recent call last):
  File "/usr/bin/torchrun", line 8, in <module>
    sys.exit(main())
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
============================================================
train.py FAILED
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  exitcode  : 1 (pid: 4243)
============================================================
"""
    scanner = scan(text)
    assert {k: v for k, v in scanner.counts_by_kind().items() if v} == {
        "nccl_error": 1, "elastic_child_failed": 1}
    assert scanner.events()[("llm", "1", "nccl_error")] == 1  # rank from the torchrun prefix


def test_interleaved_ranks_are_grouped_per_rank() -> None:
    text = (
        "[rank0]: Traceback (most recent call last):\n"
        "[rank1]: Traceback (most recent call last):\n"
        '[rank0]:   File "t.py", line 1, in f\n'
        '[rank1]:   File "t.py", line 1, in f\n'
        "[rank0]:     x()\n"
        "[rank1]:     x()\n"
        "[rank0]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.00 GiB.\n"
        "[rank1]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.00 GiB.\n"
    )
    events = scan(text).events()
    assert events[("llm", "0", "cuda_oom")] == 1
    assert events[("llm", "1", "cuda_oom")] == 1


def test_ecs_json_lines_use_message_error_and_labels() -> None:
    doc = {
        "@timestamp": "2026-11-21T10:30:30.000Z", "log.level": "error",
        "message": "step 42 failed", "ecs.version": "1.6.0",
        "labels": {"training_job": "json-job", "rank": "6"},
        "error": {"type": "torch.OutOfMemoryError",
                  "message": "CUDA out of memory. Tried to allocate 2.00 GiB.",
                  "stack_trace": 'Traceback (most recent call last):\n  File "t.py", line 3\n'
                                 '    """Handles CUDA out of memory."""\n'
                                 "torch.OutOfMemoryError: CUDA out of memory."},
    }
    ok = {"message": "step 43 loss=0.0nan_guard", "labels": {"training_job": "json-job"}}
    scanner = scan(json.dumps(doc) + "\n" + json.dumps(ok) + "\n")
    assert scanner.events() == {("json-job", "6", "cuda_oom"): 1}


def test_xid_counter_has_code_and_pci_address() -> None:
    text = ("6,1234,5678,-;NVRM: Xid (PCI:0000:3B:00): 79, pid=1234, name=python, GPU has "
            "fallen off the bus.\n"
            "NVRM: Xid (0000:af:00): 48, pid='<unknown>', name=<unknown>, An uncorrectable "
            "double bit error (DBE) has been detected on GPU in the framebuffer at partition 6\n")
    scanner = scan(text, Source(name="kernel", kernel=True))
    assert scanner.xid_events() == {("79", "0000:3b:00"): 1, ("48", "0000:af:00"): 1}
    assert scanner.events() == {("", "", "xid"): 2}


def test_line_count_includes_unterminated_last_line() -> None:
    assert scan("a\nb\nc").lines == 3
