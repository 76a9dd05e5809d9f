"""`lookup('trainwatch.stack.contract', KEY)`: a fact of the Trainwatch contract (ports, token
files, the job-name pattern), the one file where the Python package and Ansible both read them.

DOCUMENTATION below is what `ansible-doc -t lookup trainwatch.stack.contract` shows.

The source is `exporters/contract/contract.json`; the collection build
(`python -m scripts.collection build`) copies it next to this plugin, so an installed
collection carries the contract of the commit it was built from and reads nothing outside
itself. Found relative to this plugin, not through `role_path`, so a task outside any role (a
play's own task that reads a role's port) gets the same answer.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

from ansible.errors import AnsibleLookupError
from ansible.plugins.lookup import LookupBase

DOCUMENTATION = r"""
name: contract
author: Trainwatch
short_description: A fact of the Trainwatch contract (ports, token files, job-name pattern)
description:
  - Returns the value of each key of the contract built into this collection (a copy of the
    project's exporters/contract/contract.json, made by the collection build).
options:
  _terms:
    description: Keys of the contract, for example C(ports) or C(token_files).
    required: true
"""

EXAMPLES = r"""
- name: Show the contract's ports
  ansible.builtin.debug:
    msg: "{{ lookup('trainwatch.stack.contract', 'ports') }}"
"""

RETURN = r"""
_raw:
  description: The value of each key, in the order given.
  type: list
"""

CONTRACT = Path(__file__).resolve().with_name("contract.json")


@functools.cache
def _contract() -> dict[str, Any]:
    """Read once per ansible-playbook process: Ansible templates `trainwatch_ports` (and so
    runs this lookup) at every reference, for every host and task."""
    try:
        return json.loads(CONTRACT.read_text())
    except FileNotFoundError as exc:
        raise AnsibleLookupError(
            f"{CONTRACT} is missing: the collection build copies it in; install the built "
            "collection (python -m scripts.collection install) instead of using the source "
            "tree") from exc
    except (OSError, ValueError) as exc:
        raise AnsibleLookupError(f"cannot read {CONTRACT}: {exc}") from exc


class LookupModule(LookupBase):
    """The lookup itself: every term must be a key of the contract."""

    def run(self, terms: list[Any], variables: Any = None, **kwargs: Any) -> list[Any]:
        contract = _contract()
        missing = [term for term in terms if term not in contract]
        if missing:
            raise AnsibleLookupError(f"{CONTRACT} has no {missing}; it has {sorted(contract)}")
        return [contract[term] for term in terms]
