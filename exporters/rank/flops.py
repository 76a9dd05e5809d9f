"""Model FLOPs per step and peak FLOP/s per GPU and dtype: the two halves of MFU.

MFU (model FLOPs utilisation, PaLM, Chowdhery et al. 2022, appendix B) is the FLOP/s the model
needs for the samples or tokens it actually processed, divided by the accelerator's peak for
the dtype the matmuls run in. Rematerialisation (activation recomputation) does not count:
it is work the hardware did, not work the model needs.

Where the model FLOPs come from, in order of preference:
1. The job states them: `ModelFlops(per_sample=...)` or `ModelFlops(per_token=...)`, e.g. from
   a FLOP counter (torch.utils.flop_counter.FlopCounterMode over one training step, divided by
   the batch size), which is exact for the model as written.
2. `ModelFlops.from_parameters(n, seq_len)`: the 6N approximation (Kaplan et al. 2020, "Scaling
   laws", section 2.1; PaLM appendix B): a dense transformer does about 2N FLOPs per token
   forward and 4N backward, so 6N per trained token. Attention adds 12 * n_layers * seq_len *
   d_model per token (PaLM's 6N + 12*L*H*Q*T, with H*Q = d_model and T = seq_len);
   pass `attention=(n_layers, d_model)` to include it. It ignores embeddings' lookups and is
   only meant for dense decoder or encoder transformers; for anything else state the figure.

Where the peak comes from: `PEAK_FLOPS` below, dense (no 2:4 sparsity) tensor-core peak per
GPU from NVIDIA's datasheets (cited per row; the datasheets quote sparse figures for tensor
dtypes, marked "with sparsity", which are halved here). Clocks in real jobs are often below
boost, so 40-60% MFU is good for large transformer training. Override with
`peak_flops=` (FLOP/s) when the GPU is not listed, is power-capped, or for a different
definition (e.g. the sparse peak).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

DTYPES = ("fp64", "fp32", "tf32", "bf16", "fp16", "fp8")
T = 1e12

# (pattern on the NVML/CUDA device name, peak FLOP/s per dtype). First match wins, so the more
# specific names come first. fp64 is the FP64 tensor-core figure where the GPU has one.
PEAK_FLOPS: tuple[tuple[str, dict[str, float]], ...] = (
    # NVIDIA H100 Tensor Core GPU datasheet (nvidia.com/en-us/data-center/h100), PCIe column
    (r"H100.*PCIe", {"fp64": 51 * T, "fp32": 51 * T, "tf32": 378 * T, "bf16": 756 * T,
                     "fp16": 756 * T, "fp8": 1513 * T}),
    # same datasheet, H100 NVL column
    (r"H100 NVL", {"fp64": 60 * T, "fp32": 60 * T, "tf32": 418 * T, "bf16": 835 * T,
                   "fp16": 835 * T, "fp8": 1671 * T}),
    # same datasheet, H100 SXM column ("NVIDIA H100 80GB HBM3" is the SXM5 part)
    (r"H100", {"fp64": 67 * T, "fp32": 67 * T, "tf32": 494.5 * T, "bf16": 989.5 * T,
               "fp16": 989.5 * T, "fp8": 1979 * T}),
    # NVIDIA H200 Tensor Core GPU datasheet (nvidia.com/en-us/data-center/h200), SXM column
    (r"H200", {"fp64": 67 * T, "fp32": 67 * T, "tf32": 494.5 * T, "bf16": 989.5 * T,
               "fp16": 989.5 * T, "fp8": 1979 * T}),
    # NVIDIA HGX B200 datasheet (nvidia.com/en-us/data-center/hgx): 8-GPU figures / 8
    (r"B200", {"fp64": 37 * T, "tf32": 1125 * T, "bf16": 2250 * T, "fp16": 2250 * T,
               "fp8": 4500 * T}),
    # NVIDIA A100 Tensor Core GPU datasheet (nvidia.com/en-us/data-center/a100), SXM and PCIe
    (r"A100", {"fp64": 19.5 * T, "fp32": 19.5 * T, "tf32": 156 * T, "bf16": 312 * T,
               "fp16": 312 * T}),
    # NVIDIA L40S datasheet (nvidia.com/en-us/data-center/l40s)
    (r"L40S", {"fp32": 91.6 * T, "tf32": 183 * T, "bf16": 362.05 * T, "fp16": 362.05 * T,
               "fp8": 733 * T}),
    # NVIDIA L4 datasheet (nvidia.com/en-us/data-center/l4)
    (r"\bL4\b", {"fp32": 30.3 * T, "tf32": 60 * T, "bf16": 121 * T, "fp16": 121 * T,
                 "fp8": 242.5 * T}),
)
_TORCH_DTYPES = {"float64": "fp64", "float32": "fp32", "bfloat16": "bf16", "float16": "fp16",
                 "float8_e4m3fn": "fp8", "float8_e5m2": "fp8"}


def dtype_name(dtype: object) -> str:
    """'bf16' from 'bf16', 'bfloat16' or torch.bfloat16; ValueError for anything else."""
    text = str(dtype).removeprefix("torch.")
    name = _TORCH_DTYPES.get(text, text)
    if name not in DTYPES:
        raise ValueError(f"dtype {dtype!r} is not one of {list(DTYPES)} (or a torch dtype)")
    return name


def peak_flops(device_name: str, dtype: object) -> float | None:
    """Dense peak FLOP/s of one GPU for `dtype`; None when the table does not know it."""
    name = dtype_name(dtype)
    for pattern, peaks in PEAK_FLOPS:
        if re.search(pattern, device_name):
            return peaks.get(name)
    return None


def _positive(value: float | None, what: str) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not (
            math.isfinite(value) and value > 0):
        raise ValueError(f"{what} must be a positive finite number, got {value!r}")
    return float(value)


@dataclass(frozen=True)
class ModelFlops:
    """Training FLOPs (forward + backward) per sample and/or per token the job reports."""

    per_sample: float | None = None
    per_token: float | None = None

    def __post_init__(self) -> None:
        _positive(self.per_sample, "per_sample")
        _positive(self.per_token, "per_token")
        if self.per_sample is None and self.per_token is None:
            raise ValueError("give per_sample or per_token FLOPs")

    @classmethod
    def from_parameters(cls, parameters: int, seq_len: int | None = None,
                        attention: tuple[int, int] | None = None) -> ModelFlops:
        """6N per token (+ 12 * n_layers * seq_len * d_model with `attention` and seq_len);
        with seq_len also per sample (a sample being one sequence)."""
        if isinstance(parameters, bool) or not isinstance(parameters, int) or parameters <= 0:
            raise ValueError("parameters must be a positive integer")
        per_token = 6.0 * parameters
        if attention is not None:
            if seq_len is None:
                raise ValueError("attention FLOPs need seq_len")
            n_layers, d_model = attention
            per_token += 12.0 * n_layers * seq_len * d_model
        per_sample = per_token * seq_len if seq_len else None
        return cls(per_sample=per_sample, per_token=per_token)

    def of(self, samples: float | None, tokens: float | None) -> float:
        """FLOPs of one report: per token where tokens are known, else per sample."""
        if self.per_token is not None and tokens:
            return self.per_token * tokens
        if self.per_sample is not None and samples:
            return self.per_sample * samples
        return 0.0


def count_parameters(model: object) -> int:
    """Trainable parameters of a torch module (what 6N counts)."""
    return int(sum(p.numel() for p in model.parameters() if p.requires_grad))  # type: ignore[attr-defined]
