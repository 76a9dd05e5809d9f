"""Failure message forms as PyTorch, NCCL and gloo print them, each with where it comes from.

Read in the sources (issue 13, "failure text from the source"), for the releases in use
(torch 2.0 to 2.13, which ship NCCL 2.14 to 2.30):

* NVIDIA/nccl, at the release tags named below (`git show <tag>:<file>`).
* facebookincubator/gloo at cc441984208d (2025-05-16), the transport torch links in.
* pytorch/pytorch C++ at the commits named (the source index holds these versions; the whole
  repository is too large to fetch here): 0007e752d518 (ProcessGroupNCCL.cpp, Dec 2023, the 2.2
  line), 0323141fed06 (NCCLUtils.cpp, 2.5/2.6 line), 04dbcd01a205 (NCCLUtils.hpp),
  6af85b9baa97 (nccl2/HeartbeatMonitor.cpp, current).
* The installed torch 2.13.0+cpu wheel (git cf30153c4c13): its Python sources by file:line and
  its libtorch_cpu.so strings for the compiled gloo / c10d / autograd messages; the gloo lines
  marked "run here" were printed by a real 2-rank gloo job on this machine
  (tests/logs/test_failure_forms.py runs that job again).
* Forms only recognisable by their function (the CUDA allocator's text lives in the CUDA build):
  c10/cuda/CUDACachingAllocator.cpp, DeviceCachingAllocator::malloc: torch 2.0 wrote
  "(GPU 0; X total capacity; ...)", torch >= 2.1 writes "GPU 0 has a total capacity of ...".

`kinds` is the set of classes the scanner must count for the line (empty: must count nothing,
with the reason in `source`).
"""

from __future__ import annotations

from typing import NamedTuple

PT_PGNCCL = "pytorch/pytorch@0007e752 torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp"
PT_NCCLUTILS = "pytorch/pytorch@0323141f torch/csrc/distributed/c10d/NCCLUtils.cpp"
PT_NCCLUTILS_H = "pytorch/pytorch@04dbcd01 torch/csrc/distributed/c10d/NCCLUtils.hpp"
PT_HEARTBEAT = "pytorch/pytorch@6af85b9b torch/csrc/distributed/c10d/nccl2/HeartbeatMonitor.cpp"
TORCH_213 = "torch 2.13.0+cpu wheel (git cf30153c)"
GLOO = "facebookincubator/gloo@cc441984 gloo/transport/tcp/unbound_buffer.cc"
ALLOCATOR = "pytorch c10/cuda/CUDACachingAllocator.cpp DeviceCachingAllocator::malloc"


class FailureForm(NamedTuple):
    line: str
    kinds: frozenset[str]
    source: str


def _f(line: str, kinds: str, source: str) -> FailureForm:
    return FailureForm(line, frozenset(kinds.split()) if kinds else frozenset(), source)


FORMS: tuple[FailureForm, ...] = (
    # --- cuda_oom -------------------------------------------------------------------------------
    _f("torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 MiB (GPU 0; "
       "15.78 GiB total capacity; 14.56 GiB already allocated; 3.44 MiB free; 14.71 GiB reserved"
       " in total by PyTorch) If reserved memory is >> allocated memory try setting "
       "max_split_size_mb to avoid fragmentation.", "cuda_oom",
       f"{ALLOCATOR}, pre-2.1 form TORCH_CHECK_WITH(OutOfMemoryError, \"CUDA out of memory. "
       "Tried to allocate \", ..., \" (GPU \", device, \"; \", ..., \" total capacity; \" ...) "
       "(read in copies of the file in the source index, not at a tag)"),
    _f("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a "
       "total capacity of 79.11 GiB of which 1.20 GiB is free. Including non-PyTorch memory, this"
       " process has 77.90 GiB memory in use.", "cuda_oom",
       f"{ALLOCATOR}, torch >= 2.1 form (not read at a tag here: the CUDA sources are not in "
       "the CPU wheel); class torch.OutOfMemoryError since 2.5"),
    _f("RuntimeError: CUDA error: out of memory", "cuda_oom",
       "pytorch c10/cuda/CUDAException.cpp c10_cuda_check_implementation: 'CUDA error: ' + "
       "cudaGetErrorString(cudaErrorMemoryAllocation)"),
    _f("gpu-node1:4242:4301 [0] include/alloc.h:124 NCCL WARN Cuda failure 'out of memory'",
       "cuda_oom", "NVIDIA/nccl v2.14.3-1 src/include/checks.h:16 CUDACHECK WARN(\"Cuda failure "
       "'%s'\"), line prefix src/debug.cc:168; same text at v2.30.7-1 checks.h:18"),
    # --- nccl_timeout ---------------------------------------------------------------------------
    _f("[E ProcessGroupNCCL.cpp:475] [Rank 1] Watchdog caught collective operation timeout: "
       "WorkNCCL(SeqNum=668, OpType=ALLREDUCE, NumelIn=52, NumelOut=52, Timeout(ms)=1800000) ran"
       " for 1800097 milliseconds before timing out.", "nccl_timeout",
       f"{PT_PGNCCL} WorkNCCL::checkTimeout (and operator<< for WorkNCCL)"),
    _f("[Rank 0] Work WorkNCCL(SeqNum=5, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, "
       "Timeout(ms)=60000) timed out in blocking wait (NCCL_BLOCKING_WAIT=1).", "nccl_timeout",
       f"{PT_PGNCCL} WorkNCCL::synchronizeInternal"),
    _f("[rank0]:[E1122 10:00:00.000000 1 HeartbeatMonitor.cpp:1] [PG ID 0 PG GUID 0(default_pg)"
       " Rank 0] ProcessGroupNCCL's watchdog got stuck for 480 seconds without making progress in"
       " monitoring enqueued collectives. This typically indicates a NCCL/CUDA API (e.g., "
       "CudaEventDestroy) hang blocking the watchdog, and could be triggered by another thread "
       "holding the GIL inside a CUDA api (for example, CudaEventDestroy), or other "
       "deadlock-prone behaviors.", "nccl_timeout",
       f"{PT_HEARTBEAT} HeartbeatMonitor::handleStall"),
    _f("[Rank 0] NCCL monitor thread timeout. Basically, this could be due to CUDA or NCCL calls "
       "being unexpectedly blocking, especially when your program enters a deadlock state in "
       "watchdogor destructors. If you see this error, please file a bug to pytorch.",
       "nccl_timeout", f"{PT_PGNCCL} ProcessGroupNCCL::heartbeatMonitor (exitMsg)"),
    _f("[Rank 0] monitoring thread detects no heartbeat and will finally kill the process! "
       "terminateProcessGroup_0 collectiveDebugInfoMode_0", "nccl_timeout",
       f"{PT_PGNCCL} ProcessGroupNCCL::heartbeatMonitor (logMsg)"),
    _f("torch.distributed.DistBackendError: NCCL timeout in communicator initialization.",
       "nccl_timeout", f"{PT_NCCLUTILS} NCCLComm::waitUntilInitialized"),
    _f("RuntimeError: [/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/unbound_buffer.cc"
       ":78] Timed out waiting 2000ms for recv operation to complete", "nccl_timeout",
       f"{GLOO}:79-81 UnboundBuffer::waitRecv; {TORCH_213} libtorch_cpu.so; run here"),
    _f("RuntimeError: [../third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:133] Timed out "
       "waiting 1800000ms for send operation to complete", "nccl_timeout",
       f"{GLOO}:130-132 UnboundBuffer::waitSend; {TORCH_213} libtorch_cpu.so"),
    _f("[rank0]:[E1122 21:30:26.094747353 ProcessGroupGloo.cpp:67] [Rank 0]: Rank 1 failed to "
       "pass monitoredBarrier in 2000 ms", "nccl_timeout",
       f"{TORCH_213} torch/csrc/distributed/c10d/ProcessGroupGloo.cpp monitoredBarrier; run here"),
    _f("RuntimeError: [Rank 0]: Ranks 1, 2 failed to pass monitoredBarrier in 120000 ms",
       "nccl_timeout", f"{TORCH_213} ProcessGroupGloo::monitoredBarrier (waitAllRanks=True)"),
    # --- nccl_error -----------------------------------------------------------------------------
    _f("torch.distributed.DistBackendError: NCCL error in: ../torch/csrc/distributed/c10d/"
       "ProcessGroupNCCL.cpp:1970, unhandled system error (run with NCCL_DEBUG=INFO for details),"
       " NCCL version 2.19.3", "nccl_error",
       f"{PT_NCCLUTILS_H} C10D_NCCL_CHECK*: 'NCCL error in: ' __FILE__ ':' __LINE__ ', ' + "
       "ncclGetErrorWithVersion; text NVIDIA/nccl v2.18.1-1 src/init.cc ncclGetErrorString"),
    _f("RuntimeError: NCCL error in: /opt/pytorch/torch/csrc/distributed/c10d/NCCLUtils.hpp:219,"
       " unhandled cuda error, NCCL version 2.14.3", "nccl_error",
       "NVIDIA/nccl v2.14.3-1 src/init.cc:1515 ncclGetErrorString (pre-2.18 text, torch 2.0)"),
    _f("[PG 0 Rank 1] Process group watchdog thread terminated with exception: NCCL error: remote"
       " process exited or there was a network error, NCCL version 2.20.5", "nccl_error",
       f"{PT_PGNCCL} checkForNCCLErrorsInternal: 'NCCL error: ' + ncclGetErrorWithVersion; "
       "NVIDIA/nccl v2.20.5-1 src/init.cc ncclGetErrorString(ncclRemoteError)"),
    _f("torch.distributed.DistBackendError: NCCL error: timeout, NCCL version 2.30.3",
       "nccl_error", "NVIDIA/nccl v2.30.3-1 src/init.cc ncclGetErrorString(ncclTimeout) = "
       "'timeout' (new result code); PyTorch prefix as above"),
    _f("ncclUnhandledCudaError: Call to CUDA function failed.", "nccl_error",
       f"{PT_NCCLUTILS} getNcclErrorDetailStr"),
    _f("ncclSystemError: System call (e.g. socket, malloc) or external library call failed or "
       "device error. It can be also caused by unexpected exit of a remote peer.", "nccl_error",
       f"{PT_NCCLUTILS} getNcclErrorDetailStr (built without NCCL_REMOTE_ERROR)"),
    _f("ncclInternalError: Internal check failed.", "nccl_error",
       f"{PT_NCCLUTILS} getNcclErrorDetailStr"),
    _f("ncclInvalidArgument: Invalid value for an argument.", "nccl_error",
       f"{PT_NCCLUTILS} getNcclErrorDetailStr"),
    _f("ncclInvalidUsage: This usually reflects invalid usage of NCCL library.", "nccl_error",
       f"{PT_NCCLUTILS} getNcclErrorDetailStr"),
    _f("ncclRemoteError: A call failed possibly due to a network error or a remote process "
       "exiting prematurely.", "nccl_error", f"{PT_NCCLUTILS} getNcclErrorDetailStr"),
    _f("torch.distributed.DistBackendError: NCCL communicator was aborted on rank 2.  Original "
       "reason for failure was: [Rank 2] Watchdog caught collective operation timeout: "
       "WorkNCCL(SeqNum=9, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=600000) ran for "
       "600049 milliseconds before timing out.", "nccl_error nccl_timeout",
       f"{PT_NCCLUTILS} NCCLComm::getNcclComm (the reason carries the timeout, counted too)"),
    _f("RuntimeError: NCCL communicator encountered error set by ProcessGroupNCCL: Process Group "
       "destroyed on rank 3", "nccl_error", f"{PT_PGNCCL} checkForNCCLErrorsInternal"),
    _f("torch.distributed.DistBackendError: ProcessGroupNCCL: Health check failure: Failed to "
       "initialize NCCL communicator on rank 1", "nccl_error",
       f"{PT_PGNCCL} ProcessGroupNCCL::runHealthCheck"),
    _f("[1] is setting up NCCL communicator and retrieving ncclUniqueId from [0] via c10d "
       "key-value store by key '0', but store->get('0') got error: Socket Timeout. This may "
       "indicate a possible application crash on rank 0 or a network set up issue.",
       "nccl_error", f"{PT_PGNCCL} ProcessGroupNCCL::broadcastUniqueNCCLID"),
    _f("RuntimeError: [1] is setting up NCCL communicator and retreiving ncclUniqueId from [0] "
       "via c10d key-value store by key '0', but store->get('0') got error: Connection reset by "
       "peer", "nccl_error",
       "pytorch ProcessGroupNCCL.cpp broadcastUniqueNCCLID, older spelling 'retreiving' (read "
       "in an earlier copy of the file in the source index, not at a tag; @0007e752 spells it "
       "'retrieving')"),
    # --- elastic_child_failed --------------------------------------------------------------------
    _f("E1121 10:31:02.123000 4242 torch/distributed/elastic/multiprocessing/api.py:1003] failed "
       "(exitcode: 1) local_rank: 0 (pid: 4243) of binary: /usr/bin/python3",
       "elastic_child_failed",
       f"{TORCH_213} torch/distributed/elastic/multiprocessing/api.py:1003 "
       "SubprocessContext._poll"),
    _f("ERROR:torch.distributed.elastic.multiprocessing.api:failed (exitcode: -9) local_rank: 1 "
       "(pid: 51) of fn: main (start_method: spawn)", "elastic_child_failed",
       f"{TORCH_213} torch/distributed/elastic/multiprocessing/api.py:837 "
       "MultiprocessContext._poll"),
    _f("torch.distributed.elastic.multiprocessing.errors.ChildFailedError: ",
       "elastic_child_failed",
       f"{TORCH_213} torch/distributed/elastic/multiprocessing/errors/__init__.py:205"),
    _f("[default] Worker group FAILED. 3/3 attempts left; will restart worker group", "",
       f"{TORCH_213} torch/distributed/elastic/agent/server/api.py:943; not counted: it follows "
       "the 'failed (exitcode ...)' line of the same failure, which is counted"),
    # --- rendezvous_timeout ---------------------------------------------------------------------
    _f("torch.distributed.elastic.rendezvous.api.RendezvousTimeoutError", "rendezvous_timeout",
       f"{TORCH_213} torch/distributed/elastic/rendezvous/api.py:43; raised without a message "
       "at dynamic_rendezvous.py:680 and etcd_rendezvous.py:298"),
    _f("torch.distributed.DistStoreError: Timed out after 901 seconds waiting for clients. 1/2 "
       "clients joined.", "rendezvous_timeout",
       f"{TORCH_213} libtorch_cpu.so, torch/csrc/distributed/c10d/TCPStore.cpp waitForWorkers"),
    _f("torch.distributed.DistNetworkError: The client socket has timed out after 600000ms while "
       "trying to connect to (10.0.0.1, 29500).", "rendezvous_timeout",
       f"{TORCH_213} libtorch_cpu.so, TCPStore client connect ('The client socket has timed out "
       "after {} while trying to connect to ({}, {}).')"),
    # --- nonfinite_loss -------------------------------------------------------------------------
    _f("RuntimeError: The total norm of order 2.0 for gradients from `parameters` is non-finite,"
       " so it cannot be clipped. To disable this error and scale the gradients by the non-finite"
       " norm anyway, set `error_if_nonfinite=False`", "nonfinite_loss",
       f"{TORCH_213} torch/nn/utils/clip_grad.py:112"),
    _f("RuntimeError: Function 'MulBackward0' returned nan values in its 0th output.",
       "nonfinite_loss", f"{TORCH_213} libtorch_cpu.so, torch/csrc/autograd/engine.cpp "
       "(anomaly mode: \"' returned nan values in its \")"),
    # --- deliberately not counted ---------------------------------------------------------------
    _f("[Rank 1] Some NCCL operations have failed or timed out. Due to the asynchronous nature of"
       " CUDA kernels, subsequent GPU operations might run on corrupted/incomplete data.", "",
       f"{PT_PGNCCL} WorkNCCL::handleException; not counted: always follows the error or "
       "timeout line it summarises, which is counted"),
    _f("[Rank 1] To avoid data inconsistency, we are taking the entire process down.", "",
       f"{PT_PGNCCL} WorkNCCL::handleException; not counted (as above)"),
)
