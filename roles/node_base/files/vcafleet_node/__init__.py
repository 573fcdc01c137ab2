"""Copies of vcafleet module_utils for the node_base boot unit (see roles/node_base/README.md)."""
