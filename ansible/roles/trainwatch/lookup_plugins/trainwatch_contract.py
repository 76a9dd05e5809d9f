"""`lookup('trainwatch_contract', KEY)`: a fact of exporters/contract/contract.json (ports, token
files,
the job-name pattern), the one file where the Python package and Ansible both read them.

Found relative to this plugin (the repository's layout), not through `role_path`, so a task
outside any role (a play's own task that reads a role's port) gets the same answer.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

from ansible.errors import AnsibleLookupError
from ansible.plugins.lookup import LookupBase

CONTRACT = Path(__file__).resolve().parents[4] / "exporters" / "contract" / "contract.json"


@functools.cache
def _contract() -> dict[str, Any]:
    """Read once per ansible-playbook process: Ansible templates `trainwatch_ports` (and so
    runs this lookup) at every reference, for every host and task."""
    try:
        return json.loads(CONTRACT.read_text())
    except (OSError, ValueError) as exc:
        raise AnsibleLookupError(f"cannot read {CONTRACT}: {exc}") from exc


class LookupModule(LookupBase):
    def run(self, terms: list[Any], variables: Any = None, **kwargs: Any) -> list[Any]:
        contract = _contract()
        missing = [term for term in terms if term not in contract]
        if missing:
            raise AnsibleLookupError(f"{CONTRACT} has no {missing}; it has {sorted(contract)}")
        return [contract[term] for term in terms]
