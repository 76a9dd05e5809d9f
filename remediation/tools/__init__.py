"""Small programs the remediation Ansible playbooks run on a node (no shell, argv only)."""
