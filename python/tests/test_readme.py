"""What a new user does with this README (issue 43, item 11): its example runs on a server
that already holds the main README's quickstart, and installing the package leaves the
source tree as it was."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

import tidemark

from conftest import REPO, Server

PACKAGE = REPO / "python"


def readme_example() -> str:
    """The README's Python example, the first ```python block."""
    text = (PACKAGE / "README.md").read_text()
    found = re.search(r"```python\n(.*?)```", text, re.S)
    assert found, "python/README.md has no ```python block"
    return found.group(1)


def test_the_readme_example_runs_after_the_main_quickstart(tmp_path: Path) -> None:
    pytest.importorskip("pandas")
    server = Server(tmp_path / "data")
    try:
        # The main README's quickstart (its curl lines): `ticks`, two events stamped now.
        with tidemark.connect(server.url) as client:
            client.create_stream("ticks", "SYMBOL:STRING,PRICE:DOUBLE")
            now = time.time_ns()
            client.append("ticks", [
                {"tstart": now, "SYMBOL": "AAPL", "PRICE": 189.5},
                {"tstart": now, "SYMBOL": "MSFT", "PRICE": 402.25},
            ])
        code = readme_example().replace("http://127.0.0.1:8080", server.url)
        namespace: dict[str, object] = {}
        exec(compile(code, "python/README.md", "exec"), namespace)
        with tidemark.connect(server.url) as client:
            example = {s.name: s.event_count for s in client.streams()}
        # The quickstart's stream is left alone; the example's own has its two events.
        assert example.pop("ticks") == 2
        assert list(example.values()) == [2], example
    finally:
        server.stop()


def test_installing_the_package_leaves_the_source_tree_as_it_was(tmp_path: Path) -> None:
    # A copy of what git holds of the package (a previous install may have left files here).
    source = tmp_path / "python"
    shutil.copytree(PACKAGE, source, ignore=shutil.ignore_patterns(
        "build", "*.egg-info", "__pycache__", ".pytest_cache", ".mypy_cache"))
    before = sorted(p.relative_to(source) for p in source.rglob("*"))
    target = tmp_path / "site"
    # `pip install ./python` as the README says, without the network: the backend the
    # package names is in this environment (requirements-test.txt).
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-index",
         "--no-build-isolation", "--target", str(target), str(source)],
        check=True,
    )
    after = sorted(p.relative_to(source) for p in source.rglob("*"))
    assert after == before
    # The installed package is whole, its type marker too.
    assert (target / "tidemark" / "client.py").is_file()
    assert (target / "tidemark" / "py.typed").is_file()
