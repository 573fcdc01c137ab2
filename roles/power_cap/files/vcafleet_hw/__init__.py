"""Copies of vcafleet module_utils for on-node services (see roles/power_cap/README.md)."""
