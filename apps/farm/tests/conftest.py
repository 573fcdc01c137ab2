"""farm's tests: the package from src/ (not installed in the venv), real ffmpeg, RabbitMQ and Celery."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))
