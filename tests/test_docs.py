"""The book's prose tables that mirror code must agree with the code."""

import re
from pathlib import Path

from servingcap import LOCKED

ROOT = Path(__file__).resolve().parents[1]


def _locked_table():
    rows = {}
    for line in (ROOT / "intro.md").read_text().splitlines():
        cells = [c.strip() for c in line.strip("|").split("|")]
        if len(cells) == 3 and cells[2].startswith("`"):
            rows[cells[0]] = (cells[1], re.findall(r"`(\w+)`", cells[2]))
    return rows


def test_intro_parameter_table_matches_locked():
    rows = _locked_table()
    assert len(rows) == 11
    curve = rows["decode curve (step time by batch)"][0]
    points = re.findall(r"([\d.]+) ms at (\d+)", curve)
    assert {int(b): float(ms) / 1000 for ms, b in points} == dict(LOCKED.decode_curve)
    as_number = {
        "prefill rate per replica": LOCKED.prefill_rate,
        "decode step time at batch 32": LOCKED.decode_step_s * 1000,
        "typical prompt": LOCKED.prompt_tokens,
        "long-tail prompt": LOCKED.long_prompt_tokens,
        "output length": LOCKED.output_tokens,
        "TTFT objective (p99)": LOCKED.ttft_slo_s * 1000,
        "TPOT objective (p99)": LOCKED.tpot_slo_s * 1000,
        "weight read per step (derived)": round(LOCKED.weight_read_s * 1000, 9),
        "compute ridge (derived)": round(LOCKED.ridge_tokens, 9),
        "token budget per step (derived from the TPOT objective)": LOCKED.token_budget,
    }
    for name, expected in as_number.items():
        value, fields = rows[name]
        assert float(value.split()[0].replace(",", "")) == expected, name
        for field in fields:
            assert hasattr(LOCKED, field), field
    batch_row = next(name for name in rows if name.startswith("decode step time at batch"))
    assert int(batch_row.rsplit(" ", 1)[1]) == LOCKED.decode_batch


def test_the_bibliography_parses_and_holds_every_cited_key():
    # A merge once dropped an entry's closing brace; sphinxcontrib-bibtex then stops the
    # whole book build. Parse it here (pybtex, as the build does) and check every
    # {cite} key used in the chapters and appendices is defined.
    import re
    from pathlib import Path

    from pybtex.database import parse_file

    root = Path(__file__).resolve().parents[1]
    keys = set(parse_file(str(root / "references.bib")).entries)
    used = set()
    for page in [*root.glob("chapters/*.ipynb"), *root.glob("appendices/*"), root / "intro.md"]:
        for group in re.findall(r"\{cite(?::\w+)?\}`([^`]+)`", page.read_text()):
            used |= {k.strip() for k in group.split(",")}
    assert used, "no citations found: the pattern is wrong"
    assert used <= keys, sorted(used - keys)


def test_no_page_glues_the_same_key_twice():
    # myst-nb warns on a duplicate glue key, and the book is built with warnings as errors
    import collections
    import json
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    for page in [*root.glob("chapters/*.ipynb"), *root.glob("appendices/*.ipynb")]:
        names = collections.Counter(
            out.get("metadata", {}).get("scrapbook", {}).get("name")
            for cell in json.loads(page.read_text())["cells"] for out in cell.get("outputs", []))
        names.pop(None, None)
        assert not [k for k, n in names.items() if n > 1], page.name


def test_glued_values_are_plain_python_numbers():
    # A numpy scalar glues as "np.float64(...)", which myst-nb cannot format with a
    # format spec such as :.1f (a warning, so an error, in the book build): glue float(x).
    import json
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    bad = []
    for page in [*root.glob("chapters/*.ipynb"), *root.glob("appendices/*.ipynb")]:
        for cell in json.loads(page.read_text())["cells"]:
            for out in cell.get("outputs", []):
                name = out.get("metadata", {}).get("scrapbook", {}).get("name")
                text = "".join(out.get("data", {}).get(
                    "application/papermill.record/text/plain", ""))
                if name and text.startswith(("np.", "numpy.")):
                    bad.append(f"{page.stem}:{name}={text}")
    assert not bad, bad


def test_every_doc_reference_names_a_page_of_the_book():
    # {doc}`name` resolves relative to the page that holds it: a chapter that names an
    # appendix must write ../appendices/name. A dangling one is a warning, and the book
    # is built with warnings as errors, so it would fail only there, minutes later.
    pages = [*ROOT.glob("chapters/*.ipynb"), *ROOT.glob("chapters/*.md"),
             *ROOT.glob("appendices/*.ipynb"), *ROOT.glob("appendices/*.md"),
             *ROOT.glob("*.md")]
    missing = []
    for page in pages:
        for target in re.findall(r"\{doc\}`(?:[^`<]*<)?([^`>]+)>?`", page.read_text()):
            path = (page.parent / target) if not target.startswith("/") else ROOT / target[1:]
            if not any(path.with_name(path.name + ext).exists() for ext in (".ipynb", ".md")):
                missing.append(f"{page.relative_to(ROOT)}: {target}")
    assert not missing, missing
