"""Text-level PromQL inspection: metric names, range windows and counter wrapping.

Enough of a tokenizer for the linter-equivalent checks and the metric cross-check; query
*validity* is checked by the real Prometheus (tests/dashboards), not here.
"""

from __future__ import annotations

import re

_STRING = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'')
_MATCHERS = re.compile(r"\{[^{}]*\}")
_BRACKETS = re.compile(r"\[[^\[\]]*\]")
_GROUPING = re.compile(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^()]*\)")
_OFFSET = re.compile(r"\boffset\s+-?[0-9a-z]+", re.IGNORECASE)
_NUMBER = re.compile(r"(?<![\w:])[0-9]+(\.[0-9]+)?([eE][+-]?[0-9]+)?")
_VARIABLE = re.compile(r"\$\{[^}]*\}|\$\w+|\[\[\w+\]\]")
_IDENT = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
KEYWORDS = {"and", "or", "unless", "by", "without", "on", "ignoring", "group_left",
            "group_right", "offset", "bool", "inf", "nan", "atan2"}
COUNTER_SUFFIXES = ("_total", "_bucket", "_count", "_sum")
RATE_FUNCTIONS = ("rate", "irate")
COUNTER_FUNCTIONS = ("rate", "irate", "increase")


def without_strings(expr: str) -> str:
    return _STRING.sub('""', expr)


def metric_names(expr: str) -> set[str]:
    """Metric names selected by `expr` (functions, keywords, labels and numbers removed)."""
    text = _VARIABLE.sub(" ", without_strings(expr))
    text = _MATCHERS.sub(" ", text)
    text = _BRACKETS.sub(" ", text)
    text = _GROUPING.sub(" ", text)
    text = _OFFSET.sub(" ", text)
    text = _NUMBER.sub(" ", text)
    names = set()
    for match in _IDENT.finditer(text):
        rest = text[match.end():].lstrip()
        if rest.startswith("("):  # a function call
            continue
        if match.group().lower() in KEYWORDS:
            continue
        names.add(match.group())
    return names


def rate_windows(expr: str) -> list[tuple[str, str]]:
    """(function, range) of every rate()/irate() call with a plain range selector."""
    pattern = re.compile(r"\b(" + "|".join(RATE_FUNCTIONS) + r")\s*\(\s*[^\[\]()]*\[([^\]]*)\]")
    return [(m[1], m[2].strip()) for m in pattern.finditer(without_strings(expr))]


def unwrapped_counters(expr: str) -> list[str]:
    """Counter-like series (…_total/_bucket/_count/_sum) not directly inside rate/irate/increase
    with a range, the way Grafana's target-counter-agg-rule demands."""
    text = without_strings(expr)
    problems = []
    for name in sorted(n for n in metric_names(expr) if n.endswith(COUNTER_SUFFIXES)):
        uses = len(re.findall(rf"(?<![\w:]){re.escape(name)}(?![\w:])", text))
        wrapped = len(re.findall(
            rf"\b({'|'.join(COUNTER_FUNCTIONS)})\s*\(\s*{re.escape(name)}\s*(\{{[^{{}}]*\}})?\s*\[",
            text))
        if wrapped < uses:
            problems.append(name)
    return problems
