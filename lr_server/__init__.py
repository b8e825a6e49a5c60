"""The per-site ``lr`` server: sender sessions, sink receiver, trim, status, metrics, CLI."""

from __future__ import annotations
