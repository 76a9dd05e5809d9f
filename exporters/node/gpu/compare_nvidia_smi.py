"""Compare a gpu-exporter scrape with `nvidia-smi --query-gpu` on a real GPU host.

    python -m trainwatch.exporters.node.gpu.compare_nvidia_smi [--url
    http://127.0.0.1:PORT/metrics] [--json]

For each GPU and field, prints the nvidia-smi value, the exporter value (converted to
nvidia-smi's units) and whether they agree within the field's tolerance: rounding for
static values, a small band for values that move between the two reads (utilization, power,
temperature, clocks). Exit 0 when every compared field agrees, 1 otherwise, 2 when nvidia-smi
or the exporter cannot be reached. Fields nvidia-smi reports as [N/A] or [Not Supported] must
be absent from the scrape; a value there is a mismatch. A sparse row (the metric table's
`sparse`: error counters served from their first error) absent from the scrape reads as 0.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families

from trainwatch.exporters.contract import catalog as c
from trainwatch.exporters.contract.catalog import PORTS


@dataclass(frozen=True)
class Field:
    query: str  # nvidia-smi --query-gpu name
    metric: str
    scale: float  # exporter value * scale = nvidia-smi units
    tolerance: float  # absolute, in nvidia-smi units
    labels: tuple[tuple[str, str], ...] = ()
    optional: bool = False  # older nvidia-smi builds do not know this query name


FIELDS: tuple[Field, ...] = (
    Field("memory.total", c.GPU_MEMORY_TOTAL, 1 / 2**20, 1),  # MiB
    Field("memory.used", c.GPU_MEMORY_USED, 1 / 2**20, 64),
    Field("memory.reserved", c.GPU_MEMORY_RESERVED, 1 / 2**20, 1, optional=True),
    Field("utilization.gpu", c.GPU_UTILIZATION, 100, 15),
    Field("utilization.memory", c.GPU_MEMORY_UTILIZATION, 100, 15),
    Field("temperature.gpu", c.GPU_TEMPERATURE, 1, 2),
    Field("power.draw", c.GPU_POWER_USAGE, 1, 30),
    Field("power.limit", c.GPU_POWER_LIMIT, 1, 0.5),
    Field("power.min_limit", c.GPU_POWER_LIMIT_MIN, 1, 0.5),
    Field("power.max_limit", c.GPU_POWER_LIMIT_MAX, 1, 0.5),
    Field("power.default_limit", c.GPU_POWER_LIMIT_DEFAULT, 1, 0.5),
    Field("clocks.sm", c.GPU_SM_CLOCK, 1e-6, 100),
    Field("clocks.mem", c.GPU_MEMORY_CLOCK, 1e-6, 100),
    Field("pcie.link.gen.current", c.GPU_PCIE_LINK_GENERATION, 1, 0),
    Field("pcie.link.width.current", c.GPU_PCIE_LINK_WIDTH, 1, 0),
    Field("ecc.errors.corrected.volatile.total", c.GPU_ECC_ERRORS, 1, 0,
          (("error_type", "corrected"), ("counter", "volatile"))),
    Field("ecc.errors.uncorrected.aggregate.total", c.GPU_ECC_ERRORS, 1, 0,
          (("error_type", "uncorrected"), ("counter", "aggregate"))),
)
NOT_AVAILABLE = ("[N/A]", "[Not Supported]", "N/A")


def query_nvidia_smi() -> list[dict[str, str]]:
    """Every field; if this nvidia-smi rejects an optional query name, the others only."""
    try:
        return _query([f.query for f in FIELDS])
    except subprocess.CalledProcessError:
        return _query([f.query for f in FIELDS if not f.optional])


def _query(fields: list[str]) -> list[dict[str, str]]:
    keys = ["index", "uuid", *fields]
    out = subprocess.run(["nvidia-smi", f"--query-gpu={','.join(keys)}",
                          "--format=csv,noheader,nounits"],
                         capture_output=True, text=True, check=True, timeout=30).stdout
    return [dict(zip(keys, (cell.strip() for cell in line.split(",")), strict=True))
            for line in out.splitlines() if line.strip()]


def scrape(url: str) -> dict[tuple[str, str, tuple[tuple[str, str], ...]], float]:
    with urllib.request.urlopen(url, timeout=10) as response:  # noqa: S310 - operator's URL
        return per_gpu_values(response.read().decode())


def per_gpu_values(body: str) -> dict[tuple[str, str, tuple[tuple[str, str], ...]], float]:
    """(metric, gpu index, extra labels) -> value, for every series with a `gpu` label."""
    values = {}
    for family in text_string_to_metric_families(body):
        for sample in family.samples:
            if "gpu" not in sample.labels:
                continue
            extra = tuple(sorted((k, v) for k, v in sample.labels.items()
                                 if k not in ("gpu", "uuid", "name")))
            values[(sample.name, sample.labels["gpu"], extra)] = sample.value
    return values


def compare(smi_rows: list[dict[str, str]], scraped: dict,
            fields: Sequence[str] | None = None) -> list[dict[str, object]]:
    """One verdict per GPU and field that nvidia-smi answered (all fields, or `fields`)."""
    results = []
    for row in smi_rows:
        for field in FIELDS:
            if (fields is not None and field.query not in fields) or field.query not in row:
                continue
            raw = row[field.query]
            key = (field.metric, row["index"], tuple(sorted(field.labels)))
            exported = scraped.get(key)
            if raw in NOT_AVAILABLE or raw.startswith("["):  # [Unknown Error], [GPU requires reset]
                ok, expected = exported is None, None
            else:
                expected = float(raw)
                if exported is None and c.METRICS[field.metric].sparse:
                    exported = 0.0  # served only once non-zero
                ok = exported is not None and abs(exported * field.scale - expected) <= (
                    field.tolerance + 1e-9)
            results.append({"gpu": row["index"], "field": field.query, "nvidia_smi": expected,
                            "exporter": None if exported is None else exported * field.scale,
                            "tolerance": field.tolerance, "ok": ok})
    return results


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default=f"http://127.0.0.1:{PORTS['gpu_exporter']}/metrics")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    try:
        smi = query_nvidia_smi()
        scraped = scrape(args.url)
    except (OSError, subprocess.SubprocessError, ValueError) as exc:  # ValueError: odd CSV row
        print(f"compare_nvidia_smi: {exc}", file=sys.stderr)
        return 2
    results = compare(smi, scraped)
    for r in results:
        mark = "ok  " if r["ok"] else "DIFF"
        print(f"{mark} gpu {r['gpu']} {r['field']:<42} nvidia-smi={r['nvidia_smi']} "
              f"exporter={r['exporter']} (tolerance {r['tolerance']})")
    failed = sum(not r["ok"] for r in results)
    summary = {"compared": len(results), "mismatches": failed, "gpus": len(smi)}
    print(json.dumps({**summary, "results": results} if args.json else summary))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
