"""`trainwatch-remediation --url URL --token-file F {actions,approve ID,reject ID}`.

`actions` works with the webhook token or an approver token; `approve` and `reject` need an
approver token (remediation/approvers.py): the server records the name bound to that token."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import requests

from trainwatch.exporters import add_version_argument
from trainwatch.exporters.contract.tokens import SecretFileError, read_secret_file


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="trainwatch-remediation",
                                     description="List, approve and reject remediation actions.")
    add_version_argument(parser)
    parser.add_argument("--url", required=True, help="remediation service base URL")
    parser.add_argument("--token-file", required=True, type=Path,
                        help="file holding your approver token (or the webhook token, which "
                             "can only list)")
    sub = parser.add_subparsers(dest="command", required=True)
    lst = sub.add_parser("actions", help="list intents and audit records (JSON)")
    lst.add_argument("--state", help="only intents in this state, e.g. awaiting_approval")
    lst.add_argument("--limit", type=int, default=50)
    for name in ("approve", "reject"):
        p = sub.add_parser(name, help=f"{name} an intent awaiting approval")
        p.add_argument("id", type=int)
    args = parser.parse_args(argv)
    try:
        token = read_secret_file(args.token_file)
    except SecretFileError as exc:
        print(f"trainwatch-remediation: {exc}", file=sys.stderr)
        return 2
    headers = {"Authorization": f"Bearer {token}"}
    base = args.url.rstrip("/")
    try:
        if args.command == "actions":
            params: dict[str, str | int] = {"limit": args.limit}
            if args.state:
                params["state"] = args.state
            resp = requests.get(f"{base}/v1/actions", params=params, headers=headers, timeout=10)
        else:
            resp = requests.post(f"{base}/v1/actions/{args.id}/{args.command}", headers=headers,
                                 timeout=10)
    except requests.RequestException as exc:
        print(f"trainwatch-remediation: {base} unreachable: {type(exc).__name__}",
              file=sys.stderr)
        return 1
    try:
        body = resp.json()
    except ValueError:
        body = {"error": resp.text[:500]}
    print(json.dumps(body, indent=2))
    return 0 if resp.ok else 1


if __name__ == "__main__":
    sys.exit(main())
