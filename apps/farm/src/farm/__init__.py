"""farm: the Remotion render farm (Celery on RabbitMQ, nodes borrowed from smem)."""

__version__ = "0.1.0"
