"""Tools that remediation playbooks run on a GPU node: each takes validated arguments, acts on
one allowlisted target and prints a JSON result (disk cleanup, stack dumps, GPU power limit)."""
