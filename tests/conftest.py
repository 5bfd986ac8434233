"""Shared test setup: never reach for the network, keep transformers quiet."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("AUTOTUNE_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
