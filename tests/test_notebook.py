"""The walkthrough notebook runs from top to bottom (so it never goes stale)."""

from __future__ import annotations

import nbformat
import pytest
from nbclient import NotebookClient

from tests.conftest import REPO

NOTEBOOK = REPO / "notebooks" / "walkthrough.ipynb"


@pytest.mark.slow  # 28 s: the quick tier stays under 8 minutes on 2 cores (README)
def test_walkthrough_notebook_executes() -> None:
    nb = nbformat.read(NOTEBOOK, as_version=4)
    NotebookClient(nb, timeout=300, kernel_name="python3",
                   resources={"metadata": {"path": str(NOTEBOOK.parent)}}).execute()
    outputs = ["".join(o.get("text", "") for o in cell.get("outputs", [])) for cell in nb.cells
               if cell.cell_type == "code"]
    text = "\n".join(outputs)
    assert "s/iteration" in text  # the local run's summary
    assert "MAPE" in text and "720 plans" in text
    assert "wrote local-cpu-calibrated.yaml" in text
    images = [o for cell in nb.cells if cell.cell_type == "code" for o in cell.get("outputs", [])
              if "image/png" in o.get("data", {})]
    assert len(images) == 3
