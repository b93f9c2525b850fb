"""Every number in chapter prose is computed (issue 12).

A number a reader sees in a chapter's text must come from the code (a myst-nb
``{glue:text}`` role), so that re-running the chapter with other parameters cannot leave
stale numbers behind. This test scans the markdown cells of every chapter for numeric
literals outside glue roles (and every other role), math, code spans, code blocks,
labels and link targets. What is left must be covered by a short per-chapter allowlist
of phrases (structure such as "cause 2", an HTTP status code, a name with a digit).
"""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parents[1]
CHAPTERS = sorted((ROOT / "chapters").glob("*.ipynb"))

# A numeric literal: digits with optional thousands separators and decimals, not glued to
# a word (so "p99", "H100", "Llama-3" and "fp16" are names, not numbers).
NUMBER = re.compile(r"(?<![\w.\-/])\d+(?:[,.]\d+)*(?![\w])")

# Phrases that contain digits but are structure or names, allowed in every chapter.
ALLOWED_EVERYWHERE = (
    "N+1",
    "HTTP 429",
)

# Per chapter: phrases with digits that are not computed quantities.
ALLOWED = {
    "fast_model_slow_product": ("cause 2", "causes 4 and 5"),
    "littles_law": ("0 or 1",),
    "utilization_knee": ("Table 1", "Table 2"),
    "offered_load": (),
    "agent_amplification": ("CV = 1", "CV = 0"),
    "variance_penalty": ("ln(100)", "ln 100", "from 2023"),
    "step_time": ("of 2024", "The 2024 vLLM"),
    "chunked_prefill": ("Way 1", "Way 2", "Way 3", "a 413"),
    "scheduling_policies": ("Schrage, 1968", "Dertouzos, 1974", "at most 1 % may miss",
                            "priority 0", "priority 1", "slowdown of 1 means",
                            "longest 1 %", "at rate 1 whenever"),
    "goodput": ("Rule 1", "Rule 2"),
    # the playbook's item numbers (its table and one reference to item 1)
    "capacity_planning": ("Playbook item 1", *(f"| {k} |" for k in range(1, 11))),
}

def _strip_fences(text: str) -> str:
    """Drop code blocks; keep the body of directive fences (exercise, admonition...),
    but not their opening line or option lines."""
    out, fence, keep = [], None, True
    for line in text.splitlines():
        m = re.match(r"^\s*(`{3,}|~{3,}|:{3,})(.*)$", line)
        if fence is None and m:
            marker, info = m.group(1), m.group(2).strip()
            fence = marker
            directive = info.startswith("{") and not info.startswith(
                ("{code", "{code-block", "{code-cell", "{literalinclude", "{math"))
            keep = directive or marker.startswith(":")
            continue
        if fence is not None and line.strip() == fence:
            fence = None
            continue
        if fence is not None and not keep:
            continue
        if re.match(r"^\s*:[\w-]+:", line):          # directive options (:label:, :class:)
            continue
        out.append(line)
    return "\n".join(out)


def prose(markdown: str) -> str:
    """The reader-visible words of one markdown cell, without math, code and roles."""
    text = _strip_fences(markdown)
    text = re.sub(r"<!--.*?-->", " ", text, flags=re.S)
    text = re.sub(r"\$\$.*?\$\$", " ", text, flags=re.S)
    text = re.sub(r"\\begin\{(\w+\*?)\}.*?\\end\{\1\}", " ", text, flags=re.S)
    text = re.sub(r"(?<!\\)\$[^$\n]+\$", " ", text)
    text = re.sub(r"\{[\w:-]+\}`[^`]*`", " ", text)   # roles: glue, cite, doc, numref, ref
    text = re.sub(r"`[^`\n]*`", " ", text)              # code spans
    text = re.sub(r"^\([\w-]+\)=\s*$", " ", text, flags=re.M)   # labels
    text = re.sub(r"\]\([^)]*\)", "]", text)            # link targets
    text = re.sub(r"^(\s*)(#+\s+)?\d+\.\s", r"\1", text, flags=re.M)  # enumerations
    return text


def typed_numbers(path: Path) -> Counter:
    """Numeric literals left in a chapter's prose after its allowlist."""
    nb = nbformat.read(path, as_version=4)
    allowed = ALLOWED_EVERYWHERE + ALLOWED.get(path.stem, ())
    found: Counter = Counter()
    for cell in nb.cells:
        if cell.cell_type != "markdown":
            continue
        text = prose(cell.source)
        for phrase in allowed:
            text = text.replace(phrase, " ")
        found.update(NUMBER.findall(text))
    return found


@pytest.mark.parametrize("path", CHAPTERS, ids=[p.stem for p in CHAPTERS])
def test_no_typed_numbers_in_prose(path):
    typed = typed_numbers(path)
    assert not typed, (
        f"{path.stem}: numbers typed in prose {dict(typed)}; glue them from the code "
        "(myst-nb {glue:text}) or, if they are structure, add the phrase to ALLOWED")


def test_allowlists_name_real_chapters_and_phrases():
    stems = {p.stem for p in CHAPTERS}
    assert set(ALLOWED) <= stems
    for stem, phrases in ALLOWED.items():
        nb = nbformat.read(ROOT / "chapters" / f"{stem}.ipynb", as_version=4)
        text = "\n".join(c.source for c in nb.cells if c.cell_type == "markdown")
        for phrase in phrases:
            assert phrase in text, f"{stem}: allowlisted phrase {phrase!r} no longer used"


def test_the_scanner_sees_what_a_reader_sees():
    sample = (
        "(ch-x)=\n# Title\n\nA route serves 100 requests/s at $\\rho = 0.8$ and "
        "{glue:text}`rate:.2f` req/s, see {cite}`kingman1961` and `N = 32`.\n"
        "1. first item with p99 and H100\n### 2. A heading\n"
        "````{exercise}\n:label: x-ex-1\n\nA burst of 180 requests/s.\n````\n"
        "```python\nx = 5\n```\n:::{admonition} Takeaway\n:class: tip\nabout 7 %\n:::\n"
    )
    assert NUMBER.findall(prose(sample)) == ["100", "180", "7"]
