"""`trainwatch.stack.bcrypt_hash`: the bcrypt hash Alertmanager's web config (exporter-toolkit)
expects.

Ansible's own password_hash needs passlib; this uses the `bcrypt` package on the controller.
A fresh salt would change web.yml (and restart Alertmanager) on every run, so the hash already
deployed is kept while it still matches the password.
"""

from __future__ import annotations

from typing import Any


def bcrypt_hash(password: str, current: str = "") -> str:
    import bcrypt

    secret = str(password).encode()
    if current and str(current).startswith("$2"):
        try:
            if bcrypt.checkpw(secret, str(current).encode()):
                return str(current)
        except ValueError:
            pass  # not a bcrypt hash after all: make a new one
    return bcrypt.hashpw(secret, bcrypt.gensalt(rounds=10)).decode()


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {"bcrypt_hash": bcrypt_hash}
