"""The house's strict tooling holds on project code: ruff, and mypy --strict (pyproject.toml)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent


def _tool(name: str) -> str:
    path = shutil.which(name, path=str(BIN))
    if path is None:
        pytest.skip(f"{name} is not installed (it is in the dev extra)")
    return path


def test_ruff_is_clean() -> None:
    run = subprocess.run([_tool("ruff"), "check", "identity_server", "ingest", "benchmarks", "tests",
                          "proto/generate.py"],
                         check=False, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stdout + run.stderr


def test_mypy_strict_is_clean() -> None:
    run = subprocess.run([_tool("mypy")], check=False, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout + run.stderr
