"""The notebooks run top to bottom against a real server, and the outputs saved in the repo
come from such a run: every code cell has run, in order, without an error.

`make notebooks` runs them and saves their outputs (TIDEMARK_SAVE_NOTEBOOKS=1)."""

from __future__ import annotations

import os
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

from conftest import REPO, Server

NOTEBOOKS = sorted((REPO / "notebooks").glob("*.ipynb"))


def test_there_are_the_two_notebooks() -> None:
    assert [n.name for n in NOTEBOOKS] == ["chronicle-benchmark.ipynb", "quickstart.ipynb"]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_a_notebook_runs_top_to_bottom(path: Path, server: Server, monkeypatch: pytest.MonkeyPatch) -> None:
    saving = os.environ.get("TIDEMARK_SAVE_NOTEBOOKS") == "1"
    saved = nbformat.read(path, as_version=4)
    if not saving:
        check_saved_outputs(saved)
    monkeypatch.setenv("TIDEMARK_URL", server.url)
    monkeypatch.setenv("TIDEMARK_NOTEBOOK_QUICK", "1")
    run = nbformat.read(path, as_version=4)
    NotebookClient(run, timeout=900, kernel_name="python3",
                   resources={"metadata": {"path": str(path.parent)}}).execute()
    check_saved_outputs(run)
    ran = [c.source for c in run.cells if c.cell_type == "code"]
    assert ran == [c.source for c in saved.cells if c.cell_type == "code"]
    if saving:
        nbformat.write(run, path)


def check_saved_outputs(notebook: nbformat.NotebookNode) -> None:
    """Every code cell ran, once, in order, and none raised."""
    code = [c for c in notebook.cells if c.cell_type == "code"]
    assert [c.execution_count for c in code] == list(range(1, len(code) + 1)), \
        "a cell has not run, or ran out of order: `make notebooks` saves a fresh run"
    for cell in code:
        errors = [o for o in cell.outputs if o.output_type == "error"]
        assert not errors, f"cell {cell.execution_count} raised: {errors[0].ename}: {errors[0].evalue}"
