"""The Logstash pipeline's failure patterns are generated from exporters/node/logs/patterns.py and
classify a corpus of real failure lines exactly as the log scanner does.

Logstash itself cannot run here. Its `=~ /.../` conditionals use Ruby regular expressions
(Joni, JRuby's port of Ruby's Onigmo engine); the generated strings are run in Ruby's own
Regexp (Onigmo, Debian package `ruby`) and, as a second check, in Python's `re`, on the same
lines the scanner classifies.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess

import pytest
import yaml

from scripts import build
from tests.logs.failure_forms import FORMS
from tests.logs.test_scanner import NEGATIVE, POSITIVE
from trainwatch.exporters.node.logs import logstash
from trainwatch.exporters.node.logs.patterns import XID, classify_text

CORPUS = sorted({form.line for form in FORMS} | {line for _, line in POSITIVE}
                | set(NEGATIVE) | {
    "NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python, GPU has fallen off the bus.",
    "NVRM: Xid (0000:3b:00): 48, An uncorrectable double bit error",
    "step 12 loss=nan_guard ünïcødé 1.2 ٣ milliseconds before timing out",
    "LOSS IS NaN at step ٣",
})


def scanner_classes(line: str) -> list[str]:
    kinds = set(classify_text(line))
    if XID.search(line):
        kinds.add("xid")
    return sorted(kinds)


def generated_patterns() -> dict[str, str]:
    return yaml.safe_load((build.ROOT / build.LOGSTASH_VARS).read_text())[logstash.VARIABLE]


def test_committed_pattern_file_is_generated_from_the_scanner_patterns() -> None:
    assert build.plan(only=["Logstash failure patterns"]).stale() == [], (
        "run: python -m scripts.build")
    assert generated_patterns() == logstash.failure_patterns()


def test_python_re_on_the_generated_strings_classifies_like_the_scanner() -> None:
    compiled = {kind: re.compile(source) for kind, source in generated_patterns().items()}
    for line in CORPUS:
        got = sorted(kind for kind, pattern in compiled.items() if pattern.search(line))
        assert got == scanner_classes(line), line


@pytest.mark.skipif(shutil.which("ruby") is None, reason="needs ruby: setup.sh --tests")
def test_ruby_onigmo_on_the_generated_strings_classifies_like_the_scanner(tmp_path) -> None:
    """The strings as the pipeline gets them: Ruby Regexp.new(source), `=~` per line."""
    payload = tmp_path / "corpus.json"
    payload.write_text(json.dumps({"patterns": generated_patterns(), "lines": CORPUS}),
                       encoding="utf-8")
    program = (
        "require 'json'\n"
        "data = JSON.parse(File.read(ARGV[0], encoding: 'UTF-8'))\n"
        "patterns = data['patterns'].to_h { |kind, src| [kind, Regexp.new(src)] }\n"
        "out = data['lines'].map { |line| patterns.select { |_, rx| rx =~ line }.keys.sort }\n"
        "puts JSON.generate(out)\n"
    )
    result = subprocess.run(["ruby", "-e", program, str(payload)], capture_output=True,
                            text=True, timeout=60, check=True)
    classes = json.loads(result.stdout)
    for line, got in zip(CORPUS, classes, strict=True):
        assert got == scanner_classes(line), line
    assert sum(1 for got in classes if got) >= len([f for f in FORMS if f.kinds])


def test_a_pattern_logstash_would_read_differently_is_refused() -> None:
    with pytest.raises(logstash.UnportablePattern, match="explicit classes"):
        logstash.onigmo_source("x", re.compile(r"ran for \d+ ms"))
    with pytest.raises(logstash.UnportablePattern, match="IGNORECASE"):
        logstash.onigmo_source("x", re.compile("a.b", re.DOTALL))
    assert logstash.onigmo_source("x", re.compile(r"loss\\d", re.I)) == r"(?i)loss\\d"
