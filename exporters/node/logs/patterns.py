"""The failure messages the scanner recognises, as the frameworks print them.

Sources of the texts (read in their code):
* PyTorch CUDACachingAllocator: "CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a
  total capacity of ..." raised as `torch.OutOfMemoryError` (older: torch.cuda.OutOfMemoryError);
  the CUDA runtime's own "CUDA error: out of memory".
* ProcessGroupNCCL watchdog: "[Rank 0] Watchdog caught collective operation timeout:
  WorkNCCL(SeqNum=1, OpType=ALLREDUCE, ..., Timeout(ms)=600000) ran for 600081 milliseconds
  before timing out."; older releases: "Caught collective operation timeout"; "Timeout at NCCL
  work: ...".
* NCCL errors as PyTorch reports them: "NCCL error in: .../ProcessGroupNCCL.cpp:1275, unhandled
  cuda error (run with NCCL_DEBUG=INFO for details), NCCL version 2.19.3" followed by the
  ncclResult_t name (ncclUnhandledCudaError, ncclSystemError, ncclInternalError,
  ncclInvalidArgument, ncclInvalidUsage, ncclRemoteError).
* torchelastic: "failed (exitcode: 1) local_rank: 0 (pid: 123) of binary: ..." from
  multiprocessing/api.py, then `torch.distributed.elastic.multiprocessing.errors.ChildFailedError`.
* Rendezvous: `torch.distributed.elastic.rendezvous.api.RendezvousTimeoutError` (raised without
  a message) and the TCPStore's "Timed out after 901 seconds waiting for clients. 1/2 clients
  joined." (static rendezvous / env:// init).
* Non-finite loss: Megatron-LM "found NaN in local forward loss calculation" / "found NaN in
  local grad norm"; Lightning "Detected nan and/or inf values in `...`" and "Monitored metric
  val_loss = nan is not finite"; torch autograd anomaly mode "Function 'MulBackward0' returned
  nan values in its 0th output."; torch clip_grad_norm_ "... is non-finite, so it cannot be
  clipped"; fairseq "gradients are Nan/Inf" and "Minimum loss scale reached"; common training
  loop prints "loss is nan", "Loss became nan at step 10", "loss=inf", "grad norm is nan",
  "Detected inf or nan", "non-finite loss". DeepSpeed's fp16 "OVERFLOW! ... Skipping step" is
  routine loss scaling and deliberately not matched.
* NVIDIA kernel driver: "NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python, GPU has fallen
  off the bus." (older drivers print "NVRM: Xid (0000:3b:00): 79, ...").
"""

from __future__ import annotations

import re

# Cheap first pass over whole chunks: a line without one of these can match no class below.
# The chunk is lower-cased once and each token is looked for with str.find, which runs at
# memory speed; one alternation regex over the same text is several times slower in CPython.
PREFILTER_TOKENS = (
    "out of memory", "outofmemory", "nccl", "operation timeout", "childfailed", "exitcode",
    "rendezvous", "clients joined", "nan", "finite", "loss scale", "xid",
    "operation to complete", "monitoredbarrier", "no heartbeat", "client socket has timed out",
)
# "inf" as a value, not the start of "info"/"infer"/"infra"...
PREFILTER_INF = re.compile(r"inf(?![a-z_])")
# Fallback for text that is not ASCII (lower() could change its length): case variants spelled
# out on the original text.
PREFILTER = re.compile(
    r"out of memory|OutOfMemory|NCCL|nccl|ChildFailedError|exitcode|[Rr]endezvous"
    r"|clients joined|[Nn][Aa][Nn]|(?:inf|Inf|INF)\b|non-finite|not finite|Xid"
    r"|[Ll]oss scale reached|operation to complete|monitoredBarrier|no heartbeat"
    r"|client socket has timed out"
)

_NUMBER_NONFINITE = r"[-+]?(?:nan|inf(?:inity)?)\b"

# The class patterns below are also Logstash's (exporters/node/logs/logstash.py generates its copy),
# so they are written in the subset where Python's `re` and Ruby's Onigmo (Logstash's regex
# engine family) agree: explicit ASCII classes ([0-9], [ \t]) instead of \d, \w and \s, whose
# Unicode meaning differs between the two; flags only IGNORECASE (written as (?i) there).

CLASS_PATTERNS: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("cuda_oom", re.compile(
        r"CUDA out of memory|\btorch\.(?:cuda\.)?OutOfMemoryError\b|CUDA error: out of memory"
        r"|Cuda failure 'out of memory'")),
    ("nccl_timeout", re.compile(
        r"[Cc]aught collective operation timeout|[0-9] milliseconds before timing out"
        r"|Timeout at NCCL work|timed out in blocking wait|watchdog got stuck for [0-9]+ seconds"
        r"|NCCL monitor thread timeout|monitoring thread detects no heartbeat"
        r"|NCCL timeout in communicator initialization"
        r"|Timed out waiting [0-9]+ms for (?:recv|send) operation to complete"
        r"|failed to pass monitoredBarrier in|timed out in monitoredBarrier")),
    ("nccl_error", re.compile(
        # ncclResult_t names: ncclInvalidArgument and ncclInvalidUsage carry no "Error" suffix.
        r"\bNCCL error\b|\bnccl(?:(?:UnhandledCuda|System|Internal|Remote)Error|InvalidArgument"
        r"|InvalidUsage)\b|NCCL communicator was aborted|NCCL communicator encountered error"
        r"|Failed to initialize NCCL communicator"
        r"|setting up NCCL communicator and retr(?:ie|ei)ving ncclUniqueId")),
    ("elastic_child_failed", re.compile(
        r"\bChildFailedError\b|\bfailed \(exitcode: -?[0-9]+\) local_rank: [0-9]+")),
    ("rendezvous_timeout", re.compile(
        r"\bRendezvousTimeout(?:Error|Exception)\b"
        r"|waiting for clients\. [0-9]+/[0-9]+ clients joined"
        r"|The client socket has timed out after [^ ]+ while trying to connect to")),
    ("nonfinite_loss", re.compile(
        r"(?<![A-Za-z])loss(?:es)?\b(?: value)?[ \t]*(?:is|was|became|has become|=|:)[ \t]*"
        + _NUMBER_NONFINITE +
        r"|(?<![A-Za-z])grad(?:ient)?[ _]norm\b[ \t]*(?:is|was|=|:)[ \t]*" + _NUMBER_NONFINITE +
        r"|\bnon-?finite loss\b|\bloss is not finite\b|\bDetected (?:inf or nan|nan or inf)\b"
        r"|\bnan and/or inf values\b|\breturned nan values in its [0-9]+[a-z]* output\b"
        r"|\bis non-finite, so it cannot be clipped\b"
        r"|\bfound NaN in local (?:forward loss|grad norm)"
        r"|\bgradients are Nan/Inf\b|\bMinimum loss scale reached\b"
        r"|= " + _NUMBER_NONFINITE + r" is not finite",
        re.IGNORECASE)),
)

XID = re.compile(
    r"NVRM: Xid \((?:PCI:)?([0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}(?:\.[0-7])?)\): "
    r"([0-9]+)\b")

# "[rank1]:" is what torchrun puts in front of each line of a rank's redirected output.
RANK_PREFIX = re.compile(r"\[(?:default)?rank(\d+)\]:\s?")

# A line that starts a new log record (timestamp, glog "E1121 ", "[...", JSON, level word);
# anything else after a traceback belongs to the exception message before it.
RECORD_START = re.compile(
    r"(?:\d|\{|\[(?!\d+\]:)|[IWEFD]\d{4} |(?:INFO|WARNING|WARN|ERROR|DEBUG|CRITICAL|FATAL)\b"
    r"|NVRM)")

TRACEBACK_HEADER = "Traceback (most recent call last):"
CHAIN_MARKERS = (
    "During handling of the above exception, another exception occurred:",
    "The above exception was the direct cause of the following exception:",
)


# Lower-case substrings one of which a line must contain before a class's full regex runs:
# the full regexes are precise but slow on long lines, the guards are C-speed `in` checks.
_GUARDS: dict[str, tuple[str, ...]] = {
    "cuda_oom": ("out of memory", "outofmemory"),
    "nccl_timeout": ("collective operation timeout", "before timing out", "timeout at nccl",
                     "blocking wait", "watchdog got stuck", "monitor thread timeout",
                     "no heartbeat", "nccl timeout", "operation to complete", "monitoredbarrier"),
    "nccl_error": ("nccl",),
    "elastic_child_failed": ("childfailederror", "exitcode"),
    "rendezvous_timeout": ("rendezvoustimeout", "clients joined", "client socket has timed out"),
    "nonfinite_loss": ("nan", "inf", "finite", "loss scale"),
}
_GUARDED = tuple((kind, _GUARDS[kind], pattern) for kind, pattern in CLASS_PATTERNS)


def classify_text(text: str) -> list[str]:
    """Every class whose message appears in `text` (each at most once)."""
    lower = text.lower()
    return [kind for kind, guards, pattern in _GUARDED
            if any(guard in lower for guard in guards) and pattern.search(text)]
