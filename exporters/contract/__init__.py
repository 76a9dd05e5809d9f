"""The shared contract: what the rank-side library, the node-side exporters, the rule and
dashboard generators and the remediation service all agree on.

Metric names and label sets (`catalog`, exported as `contract.json` for other languages), job and
rank identity (`identity`, `launcher`), the datagram a rank sends its node (`wire`), training
commands (`commands`), the goodput kinds and wire values (`goodput`), credentials (`tokens`),
the HTTP serving defaults (`serving`), atomic file writes (`atomic_file`) and finite-number
checks (`finite`).
Nothing here imports the rank-side or node-side packages, so both can depend on it.
"""
