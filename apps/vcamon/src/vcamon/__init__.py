"""vcamon: temperature, power and throttle monitoring for VCA 2 nodes and their host."""

__version__ = "0.1.0"
