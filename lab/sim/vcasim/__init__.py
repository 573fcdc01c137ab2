"""Lab-only hardware simulator for vcafleet (see lab/sim/README.md)."""
