"""The environment `make` builds: kernels started from .venv run quietly.

The Makefile writes .venv/etc/ipython/ipython_kernel_config.py (see the comment at its
target), which drops ipykernel's "Kernel is running over TCP without encryption" log
record; without it `make book` printed that line once per chapter.
"""

import subprocess
import sys
from pathlib import Path

KERNEL_CONFIG = Path(sys.prefix) / "etc" / "ipython" / "ipython_kernel_config.py"
NOTICE = "Kernel is running over TCP without encryption"

# One cell, run the way myst-nb (jupyter-book), nbval and papermill run chapters: an
# nbclient NotebookClient with an unconfigured KernelManager (plain TCP on 127.0.0.1).
RUN_ONE_CELL = """
import nbclient, nbformat
nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("print(6 * 7)")])
nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
nbclient.execute(nb)
print(nb.cells[0].outputs[0]["text"], end="")
"""


def test_make_wrote_the_kernel_config():
    assert KERNEL_CONFIG.is_file(), f"{KERNEL_CONFIG} is missing: run `make test` (or make book)"


def test_kernel_runs_without_the_plain_tcp_notice():
    done = subprocess.run([sys.executable, "-c", RUN_ONE_CELL], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "42\n"
    assert NOTICE not in done.stderr
