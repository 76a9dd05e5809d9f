"""Refresh the exp_annotations of promtool unit tests after an alert's wording changed.

Usage: python -m alert_rules.refresh_annotations alert_rules/tests/production/gpu_test.yml ...

promtool compares rendered annotations exactly, so every firing case spells out its summary,
description and runbook_url. This tool removes those blocks, runs `promtool test rules`, and
writes back what promtool rendered, under each `- exp_labels: {...}` line (one-line flow style
is required) whose labels match. Labels, timings and input series stay hand-written; review
the diff of the annotations like any other change.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import yaml

_PAIR = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')
_EXP_LABELS = re.compile(r"(\s*)- exp_labels: (\{.*\})\s*$")
_ALERTNAME = re.compile(r"\s*- alertname: (\w+)")
ANNOTATION_KEYS = ("summary", "description", "runbook_url")


def _parse_pairs(text: str) -> dict[str, str]:
    return {k: json.loads(f'"{v}"') for k, v in _PAIR.findall(text)}


def _strip(lines: list[str]) -> list[str]:
    out, skip = [], 0
    for line in lines:
        if skip:
            skip -= 1
        elif line.strip() == "exp_annotations:":
            skip = len(ANNOTATION_KEYS)
        else:
            out.append(line)
    return out


def _rendered(path: Path) -> dict[frozenset[tuple[str, str]], dict[str, str]]:
    """Alert labels -> annotations promtool rendered for them."""
    result = subprocess.run(["promtool", "test", "rules", path.name], cwd=path.parent,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    got: dict[frozenset[tuple[str, str]], dict[str, str]] = {}
    for block in result.stdout.split("got:[")[1:]:
        labels = None
        for line in block.splitlines():
            line = line.strip()
            if line == "]":  # end of this got:[...] list
                break
            if line.startswith("Labels:{"):
                labels = _parse_pairs(line)
            elif line.startswith("Annotations:{") and labels is not None:
                got[frozenset(labels.items())] = _parse_pairs(line)
                labels = None
    return got


def refresh(path: Path) -> list[str]:
    """Rewrite `path`; returns the exp_labels lines nothing was rendered for."""
    lines = _strip(path.read_text().splitlines())
    path.write_text("\n".join(lines) + "\n")
    got = _rendered(path)
    out, missing, alertname = [], [], None
    for line in lines:
        out.append(line)
        if match := _ALERTNAME.match(line):
            alertname = match[1]
        if (match := _EXP_LABELS.match(line)) and alertname:
            labels = {k: str(v) for k, v in yaml.safe_load(match[2]).items()}
            annotations = got.get(frozenset({**labels, "alertname": alertname}.items()))
            if annotations is None:
                missing.append(line.strip())
                continue
            indent = match[1] + "  "
            out.append(f"{indent}exp_annotations:")
            out.extend(f"{indent}  {key}: {json.dumps(annotations.get(key, ''))}"
                       for key in ANNOTATION_KEYS)
    path.write_text("\n".join(out) + "\n")
    return missing


def main(argv: list[str] | None = None) -> int:
    paths = [Path(p) for p in (argv if argv is not None else sys.argv[1:])]
    if not paths or not all(p.is_file() for p in paths):
        print("usage: python -m alert_rules.refresh_annotations TEST_FILE...", file=sys.stderr)
        return 2
    status = 0
    for path in paths:
        for line in refresh(path):
            print(f"{path}: no alert rendered for {line}", file=sys.stderr)
            status = 1
    return status


if __name__ == "__main__":
    sys.exit(main())
