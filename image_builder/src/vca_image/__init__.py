"""vca-image: reproducible VCA node OS images from YAML profiles."""

__version__ = "0.1.0"
