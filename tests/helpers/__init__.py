"""Test helpers, not tests: backends and adapters, the CLI runner, the torture harnesses."""

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
"""The repository's root (README.md, pyproject.toml, docker-compose.yml)."""
