"""Data only: the systemd unit, the example settings file and the environment file that
`pegainfer install-service` installs (read through importlib.resources, so that an install from a
wheel has them as well as a checkout)."""
from __future__ import annotations
