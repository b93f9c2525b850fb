"""Every shell command the README shows must work, so the README cannot drift.

The test parses README.md generically (no command is hard-coded here) and exercises each
command of each fenced ``bash``/``sh``/``shell`` block, run from the repository root:

* ``make TARGET``: ``make test`` runs this very test, so a make command is not run; the
  test checks that the Makefile has the target (``make -n TARGET`` succeeds). The same
  holds for every ``make TARGET`` the prose mentions in inline code.
* ``jupyter lab FILE...`` (or ``jupyter-lab``): JupyterLab is started headless on a free
  127.0.0.1 port (``--no-browser``, a fixed token, ``--allow-root`` when the test runs as
  root), the test waits for the server, checks that each FILE is served as a notebook,
  that the JupyterLab page loads, that the ipywidgets lab extension is active (the "Try
  your own numbers" sliders need it), and that a Python kernel starts and goes idle;
  then the server is stopped.
* any other command (``python -m servingcap plan``, ``papermill``, ...) runs as written,
  except that an argument under ``/tmp/`` is redirected into pytest's temporary
  directory. It must exit with status 0. When the README shows the command's output
  right after the block (a fenced ``text`` block following the command block, with at
  most one paragraph between them), the command's standard output must equal it exactly.
* a fenced ``toml`` block whose first line reads ``# FILE -- COMMAND`` is written to FILE
  in a temporary directory and COMMAND is run there (it must exit 0); for the plan
  command a smaller ``--requests`` budget is appended (the command line wins over the
  file), because no output is shown for it.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
SHELLS = {"bash", "sh", "shell", "console"}
FENCE = re.compile(r"^```(\w*)[^\n]*\n(.*?)^```[ \t]*$", re.M | re.S)
# Budgets appended to commands whose README shows no output to compare (the last
# occurrence of an option wins with argparse, so these override the file/README value).
SMALL_BUDGET = {"servingcap plan": ["--requests", "1000", "--budget", "2", "--rtol", "0.25",
                                   "--no-progress"]}
COMMAND_TIMEOUT_S = 300
LAB_START_TIMEOUT_S = 60


def fenced_blocks(text: str) -> list[tuple[str, str, int, int]]:
    """(language, body, start offset, end offset) of every fenced block in `text`."""
    return [(m.group(1).lower(), m.group(2), m.start(), m.end()) for m in FENCE.finditer(text)]


def commands(body: str) -> list[list[str]]:
    """The commands of a shell block: continuation lines joined, comments dropped."""
    joined = re.sub(r"\\\n", " ", body)
    out = []
    for line in joined.splitlines():
        words = shlex.split(line, comments=True)
        if words:
            out.append(words)
    return out


def shell_commands() -> list[tuple[list[str], str | None]]:
    """Each README shell command with the output the README shows for it (or None).

    A block's output is the next fenced ``text`` block when at most one paragraph of
    prose separates them, and only for a block holding a single command.
    """
    text = README.read_text(encoding="utf-8")
    blocks = fenced_blocks(text)
    found = []
    for i, (lang, body, _, end) in enumerate(blocks):
        if lang not in SHELLS:
            continue
        cmds = commands(body)
        expected = None
        if len(cmds) == 1 and i + 1 < len(blocks) and blocks[i + 1][0] == "text":
            between = text[end:blocks[i + 1][2]].strip()
            if "\n\n" not in between:
                expected = blocks[i + 1][1]
        found.extend((cmd, expected if len(cmds) == 1 else None) for cmd in cmds)
    return found


def config_examples() -> list[tuple[str, str, list[str]]]:
    """(file name, file text, command) of each ``toml`` block headed ``# FILE -- COMMAND``."""
    found = []
    for lang, body, _, _ in fenced_blocks(README.read_text(encoding="utf-8")):
        first = body.splitlines()[0] if body.strip() else ""
        m = re.match(r"#\s*(\S+)\s+--\s+(.+)$", first)
        if lang == "toml" and m:
            found.append((m.group(1), body, shlex.split(m.group(2))))
    return found


def is_make(cmd: list[str]) -> bool:
    return Path(cmd[0]).name == "make"


def is_lab(cmd: list[str]) -> bool:
    name = Path(cmd[0]).name
    return name == "jupyter-lab" or (name == "jupyter" and cmd[1:2] == ["lab"])


def with_budget(cmd: list[str]) -> list[str]:
    line = " ".join(cmd)
    extra = [opt for key, opts in SMALL_BUDGET.items() if key in line for opt in opts]
    return cmd + extra


def resolved(cmd: list[str], tmp_path: Path) -> list[str]:
    """`cmd` with `python` as this interpreter and /tmp/ paths moved into `tmp_path`."""
    head = [sys.executable] if cmd[0] in ("python", "python3") else [cmd[0]]
    rest = [str(tmp_path / Path(a).name) if a.startswith("/tmp/") else a for a in cmd[1:]]
    return head + rest


def run(cmd: list[str], cwd: Path) -> subprocess.CompletedProcess:
    exe = cmd[0] if os.path.isabs(cmd[0]) or "/" not in cmd[0] else str(cwd / cmd[0])
    if "/" in cmd[0]:
        assert Path(exe).exists(), f"README command {cmd[0]!r} does not exist (run `make test`)"
    return subprocess.run(cmd, cwd=cwd, capture_output=True, text=True,
                          timeout=COMMAND_TIMEOUT_S)


SHELL_COMMANDS = shell_commands()
RUNNABLE = [(c, e) for c, e in SHELL_COMMANDS if not is_make(c) and not is_lab(c)]
LAB = [c for c, _ in SHELL_COMMANDS if is_lab(c)]


def test_readme_has_the_commands_this_test_knows_how_to_run():
    # Guards the parser: the README documents both make commands, a live JupyterLab, and
    # runnable commands; if parsing silently found nothing, every test below would pass.
    makes = [c for c, _ in SHELL_COMMANDS if is_make(c)]
    assert {"book", "test"} <= {c[1] for c in makes if len(c) > 1}
    assert LAB and RUNNABLE


def test_make_targets_exist():
    text = README.read_text(encoding="utf-8")
    targets = {c[1] for c, _ in SHELL_COMMANDS if is_make(c) and len(c) > 1}
    targets |= set(re.findall(r"`make ([\w.-]+)`", text))
    for target in sorted(targets):
        dry = subprocess.run(["make", "-n", target], cwd=ROOT, capture_output=True, text=True,
                             timeout=60)
        assert dry.returncode == 0, f"README's `make {target}`: {dry.stderr.strip()}"


@pytest.mark.parametrize("cmd, expected", RUNNABLE, ids=[" ".join(c)[:60] for c, _ in RUNNABLE])
def test_readme_command_runs(cmd, expected, tmp_path):
    argv = resolved(cmd if expected is not None else with_budget(cmd), tmp_path)
    done = run(argv, ROOT)
    assert done.returncode == 0, f"{' '.join(cmd)} failed:\n{done.stderr[-3000:]}"
    if expected is not None:
        assert done.stdout == expected, "README output differs from what the command prints"


@pytest.mark.parametrize("name, body, cmd", config_examples())
def test_readme_config_example_runs(name, body, cmd, tmp_path):
    (tmp_path / name).write_text(body, encoding="utf-8")
    done = run(resolved(with_budget(cmd), tmp_path), tmp_path)
    assert done.returncode == 0, f"{' '.join(cmd)} with the README's {name}:\n{done.stderr[-3000:]}"


def test_jupyter_lab_is_installed():
    # The README's `.venv/bin/jupyter lab`: JupyterLab is pinned in requirements.txt.
    done = subprocess.run([str(Path(sys.executable).parent / "jupyter"), "lab", "--version"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert re.fullmatch(r"\d+\.\d+\.\d+\s*", done.stdout)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get(url: str, method: str = "GET"):
    with urllib.request.urlopen(urllib.request.Request(url, method=method), timeout=10) as r:
        body = r.read()
        return json.loads(body) if r.headers.get_content_type() == "application/json" else body


@pytest.mark.parametrize("cmd", LAB, ids=[" ".join(c)[:60] for c in LAB])
def test_readme_jupyter_lab_serves_the_notebook_with_widgets(cmd, tmp_path):
    files = [a for a in cmd[1:] if a != "lab" and not a.startswith("-")]
    for f in files:
        assert (ROOT / f).is_file(), f"README opens {f}, which does not exist"
    port, token = free_port(), "readme-test"
    argv = cmd + ["--no-browser", f"--ServerApp.port={port}", "--ServerApp.ip=127.0.0.1",
                  f"--IdentityProvider.token={token}"]
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        argv.append("--allow-root")
    env = dict(os.environ, JUPYTER_RUNTIME_DIR=str(tmp_path / "runtime"))
    exe = str(ROOT / argv[0]) if "/" in argv[0] else argv[0]
    assert "/" not in argv[0] or Path(exe).exists(), f"{argv[0]} does not exist"
    lab = subprocess.Popen([exe, *argv[1:]], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True)
    log: list[str] = []
    threading.Thread(target=lambda: log.extend(lab.stdout), daemon=True).start()
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + LAB_START_TIMEOUT_S
        while True:
            assert lab.poll() is None, "jupyter lab exited:\n" + "".join(log)[-3000:]
            try:
                get(f"{base}/api/status?token={token}")
                break
            except OSError:
                assert time.monotonic() < deadline, "jupyter lab did not start:\n" + "".join(log)
                time.sleep(0.3)
        # With a file argument the server's root is that file's directory.
        for f in files:
            model = get(f"{base}/api/contents/{Path(f).name}?content=0&token={token}")
            assert model["type"] == "notebook"
            assert b"JupyterLab" in get(f"{base}/lab/tree/{Path(f).name}?token={token}")
        extensions = {e["name"] for e in get(f"{base}/lab/api/extensions?token={token}")}
        assert "jupyter-widgets-jupyterlab-manager" in extensions
        # A Python kernel starts; the restart endpoint answers only once the kernel
        # replies to kernel_info (the REST state stays "starting" without a websocket).
        kernel = get(f"{base}/api/kernels?token={token}", method="POST")
        restarted = get(f"{base}/api/kernels/{kernel['id']}/restart?token={token}", method="POST")
        assert restarted["id"] == kernel["id"]
    finally:
        lab.terminate()
        try:
            lab.wait(30)
        except subprocess.TimeoutExpired:
            lab.kill()
            lab.wait(10)
