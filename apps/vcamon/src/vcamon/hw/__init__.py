"""The node readers vcafleet's Ansible modules use (links to module_utils/): one safe sysfs reader."""
