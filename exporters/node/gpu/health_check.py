"""`python -m trainwatch.exporters.node.gpu.health_check --json`: may this node run jobs again?
(issue 23)

Run on a drained node by the node_health_check Ansible playbook before Trainwatch returns the
node to the scheduler (remediation/resume.py). A lost GPU stops being scraped, so its alert
resolves by itself: only a check like this one says the node is healthy. It asks NVML, the
same library the exporter reads (the fake through $TRAINWATCH_FAKE_NVML on test hosts):

* every GPU answers (handle, UUID, memory info); `--expect-gpus N`: and there are N of them;
* no GPU has rows pending remapping (a reset is due) or a failed remapping (an RMA);
* no uncorrectable volatile ECC errors since the last reset;
* `--burn-seconds S` on a host with CUDA: a matmul burn on every GPU and, with more than
  one, an all-reduce over NCCL; skipped (said so) where there is no CUDA.

XIDs since the drain are counted by the remediation host from Prometheus (the exporter's
XID counter), not here: NVML keeps no XID history. Exit 0 healthy, 1 not, 2 cannot check.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

import pynvml

from trainwatch.exporters.node.gpu.nvml_source import load_nvml


def check(nvml: Any, expect_gpus: int | None = None) -> dict[str, Any]:
    """One record per GPU and the verdict; NVML errors are findings, never crashes."""
    problems: list[str] = []
    gpus: list[dict[str, Any]] = []
    nvml.nvmlInit()
    try:
        count = int(nvml.nvmlDeviceGetCount())
        if expect_gpus is not None and count != expect_gpus:
            problems.append(f"{count} GPUs answer NVML, {expect_gpus} expected")
        for index in range(count):
            gpu: dict[str, Any] = {"index": index}
            try:
                handle = nvml.nvmlDeviceGetHandleByIndex(index)
                gpu["uuid"] = nvml.nvmlDeviceGetUUID(handle)
                nvml.nvmlDeviceGetMemoryInfo(handle)
            except pynvml.NVMLError as exc:
                gpu["error"] = str(exc)
                problems.append(f"GPU {index}: {exc}")
                gpus.append(gpu)
                continue
            try:
                corrected, uncorrected, pending, failure = nvml.nvmlDeviceGetRemappedRows(handle)
                gpu["remapped_rows"] = {"correctable": corrected, "uncorrectable": uncorrected,
                                        "pending": bool(pending), "failure": bool(failure)}
                if pending:
                    problems.append(f"GPU {index}: rows pending remapping (reset the GPU)")
                if failure:
                    problems.append(f"GPU {index}: row remapping failed (RMA)")
            except pynvml.NVMLError_NotSupported:
                gpu["remapped_rows"] = "not supported"
            except pynvml.NVMLError as exc:
                problems.append(f"GPU {index}: remapped rows: {exc}")
            try:
                ecc = nvml.nvmlDeviceGetTotalEccErrors(
                    handle, pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, pynvml.NVML_VOLATILE_ECC)
                gpu["ecc_uncorrected_volatile"] = int(ecc)
                if ecc:
                    problems.append(f"GPU {index}: {ecc} uncorrectable ECC errors since reset")
            except pynvml.NVMLError_NotSupported:
                gpu["ecc_uncorrected_volatile"] = "not supported"
            except pynvml.NVMLError as exc:
                problems.append(f"GPU {index}: ECC: {exc}")
            gpus.append(gpu)
    finally:
        nvml.nvmlShutdown()
    return {"healthy": not problems, "problems": problems, "gpus": gpus}


def burn(seconds: float) -> dict[str, Any]:
    """A short matmul burn per GPU (and an all-reduce across them) where CUDA exists."""
    try:
        import torch
    except ImportError:
        return {"skipped": "torch is not installed"}
    if not torch.cuda.is_available():
        return {"skipped": "no CUDA device"}
    results: dict[str, Any] = {}
    for index in range(torch.cuda.device_count()):
        device = torch.device("cuda", index)
        a = torch.randn(4096, 4096, device=device)
        end, n = time.monotonic() + seconds, 0
        while time.monotonic() < end:
            a = torch.tanh(a @ a)
            n += 1
        torch.cuda.synchronize(device)
        if not torch.isfinite(a).all():
            raise RuntimeError(f"GPU {index}: burn produced non-finite values")
        results[str(index)] = {"matmuls": n}
    if torch.cuda.device_count() > 1:
        tensors = [torch.ones(1 << 20, device=torch.device("cuda", i))
                   for i in range(torch.cuda.device_count())]
        torch.cuda.nccl.all_reduce(tensors)
        results["all_reduce"] = all(float(t[0]) == len(tensors) for t in tensors)
        if not results["all_reduce"]:
            raise RuntimeError("all-reduce across the GPUs gave a wrong sum")
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m trainwatch.exporters.node.gpu.health_check",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="one JSON object on stdout")
    parser.add_argument("--expect-gpus", type=int, default=None)
    parser.add_argument("--burn-seconds", type=float, default=0.0)
    args = parser.parse_args(argv)
    try:
        nvml, _ = load_nvml()
        report = check(nvml, args.expect_gpus)
    except (pynvml.NVMLError, OSError, ValueError) as exc:
        print(json.dumps({"healthy": False, "problems": [f"cannot check: {exc}"]}))
        return 2
    if args.burn_seconds > 0 and report["healthy"]:
        try:
            report["burn"] = burn(args.burn_seconds)
        except RuntimeError as exc:
            report["healthy"] = False
            report["problems"].append(str(exc))
    print(json.dumps(report) if args.json else
          ("healthy" if report["healthy"] else "NOT healthy: " + "; ".join(report["problems"])))
    return 0 if report["healthy"] else 1


if __name__ == "__main__":
    sys.exit(main())
