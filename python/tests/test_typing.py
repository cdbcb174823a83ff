"""The package's type hints hold: mypy --strict accepts it (its py.typed marker promises
users that they can rely on them)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "tidemark"


def test_mypy_strict_accepts_the_package() -> None:
    run = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", str(PACKAGE)],
        capture_output=True, text=True, cwd=PACKAGE.parent,
    )
    assert run.returncode == 0, run.stdout + run.stderr


def test_the_package_says_it_is_typed() -> None:
    assert (PACKAGE / "py.typed").exists()
