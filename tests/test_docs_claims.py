"""The user-facing docs claim no more than docs/RESULTS.md records: a GPU run is claimed (README,
CARD.md, docs/RELEASE.md, the package's docstrings) only on a card RESULTS §9 records, never on
"every GPU"; while §9 records none, they say so; and every speed figure in the README's speed
tables appears in RESULTS."""
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

USER_DOCS = ["README.md", "CARD.md", "docs/RELEASE.md", *sorted(
    str(p.relative_to(ROOT)) for p in (ROOT / "torch-ext" / "det_infer").glob("*.py"))]
NOT_RUN = "not yet run on a GPU"
# Sentences that say the megakernel did not run, so that the claim search below skips them.
_NEGATED = re.compile(r"(not yet|has not|have not|never|no CUDA variant has|not)\s+(yet\s+)?(been\s+)?"
                      r"(run|ran|tested|measured)\s+on\s+(an?\s+)?\w+", re.I)
_CLAIM = re.compile(r"\b(ran|runs?|tested|measured|verified|reproduc\w*|minted|certified)\s+"
                    r"(bit for bit\s+)?on\s+(an?\s+|the\s+|every\s+)?"
                    r"(GPU|H100|H200|A100|A10|L4|L40|T4|V100|RTX|Blackwell|Hopper|Ada|CUDA (card|GPU|device)s?)\b",
                    re.I)


def claims_gpu_run(text: str) -> list:
    """The phrases of text that say something ran on a GPU (negated sentences removed first)."""
    return [m.group(0) for m in _CLAIM.finditer(_NEGATED.sub("", _flat(text)))]


def _flat(text):
    """Markdown emphasis dropped and lines joined, so a phrase wrapped across lines still reads whole."""
    return " ".join(text.replace("*", "").split())


def _run_table():
    """The rows of RESULTS §9's run table ('| date | card | ...') as dicts; [] while it says none."""
    text = (ROOT / "docs" / "RESULTS.md").read_text()
    section = text.split("\n## 9.", 1)[1].split("\n## ", 1)[0]
    lines = section.splitlines()
    head = next((i for i, line in enumerate(lines) if line.replace(" ", "").startswith("|date|card|")), None)
    if head is None:
        assert "GPU runs recorded: none" in section, "RESULTS §9 must hold a '| date | card |' table or say none"
        return []
    keys = [c.strip() for c in lines[head].strip("|").split("|")]
    rows = []
    for line in lines[head + 2:]:
        if not line.startswith("|"):
            break
        rows.append(dict(zip(keys, (c.strip() for c in line.strip("|").split("|")))))
    return rows


def recorded_cards() -> set:
    """Short names of the cards RESULTS §9 records runs on ('NVIDIA H200' -> 'H200')."""
    return {row["card"].split()[-1] for row in _run_table()}


def unrecorded_claims(text: str, cards: set) -> list:
    """The GPU-run claims of text that RESULTS does not back: one on every GPU (or every CUDA card),
    one on a named card not in `cards`, or any claim while `cards` is empty."""
    bad = []
    for claim in claims_gpu_run(text):
        target = claim.split(" on ", 1)[1]
        named = re.search(r"H100|H200|A100|A10|L40|L4|T4|V100|RTX|Blackwell|Hopper|Ada", target)
        if not cards or target.lower().startswith("every") or (named and named.group(0) not in cards):
            bad.append(claim)
    return bad


def test_claim_detector_can_fail():
    assert claims_gpu_run("Its digests reproduce on an H200 and on every CUDA GPU.")
    assert claims_gpu_run("The megakernel was measured on the GPU at 800 tok/s.")
    assert not claims_gpu_run("The megakernel has not yet run on a GPU.")
    assert not claims_gpu_run("It is compiled for sm_90; no CUDA variant has run on a GPU yet.")
    assert unrecorded_claims("Its digests reproduce on every CUDA GPU.", {"H200"})
    assert unrecorded_claims("It was tested on an H100.", {"H200"})
    assert unrecorded_claims("It was tested on an H200.", set())
    assert not unrecorded_claims("It was tested on an H200.", {"H200"})


def test_results_run_table_parses():
    for row in _run_table():
        assert re.fullmatch(r"\d{4}-\d{2}-\d{2}", row["date"]), row
        assert row["card"] and row["digests"], row


@pytest.mark.parametrize("path", USER_DOCS)
def test_docs_claim_only_recorded_gpu_runs(path):
    text = (ROOT / path).read_text()
    cards = recorded_cards()
    assert not unrecorded_claims(text, cards), f"{path} claims a GPU run that RESULTS §9 does not record"
    if path not in ("README.md", "CARD.md"):
        return
    flat = _flat(text)
    if not cards:
        assert NOT_RUN in flat, f"{path} must say plainly that the megakernel has {NOT_RUN}"
        return
    for card in cards:  # each recorded card is named, and what did not run is said
        assert card in flat, f"{path} must name the GPU RESULTS §9 records a run on ({card})"
    assert "compiled and audited, not run" in flat, \
        f"{path} must say that the architectures without a recorded run are compiled and audited, not run"


def _speed_tables(text):
    """The table rows of every '## Speed' section (CPU, GPU), header rows included."""
    rows = []
    for section in text.split("\n## Speed")[1:]:
        section = section.split("\n## ", 1)[0]
        rows.append([line for line in section.splitlines() if line.startswith("|") and not set(line) <= set("|-: ")])
    return rows


def test_readme_speed_figures_are_in_results():
    """Every number in the README's speed tables is one RESULTS.md shows (same run, same rounding)."""
    results = (ROOT / "docs" / "RESULTS.md").read_text()
    tables = _speed_tables((ROOT / "README.md").read_text())
    assert len(tables) >= 2, "the README has a CPU and a GPU speed table"
    assert all(len(rows) >= 3 for rows in tables), "each speed table has a header and at least two rows"
    numbers = {n for rows in tables for row in rows[1:] for n in re.findall(r"\d[\d,]*(?:\.\d+)?x?", row)}
    missing = sorted(n for n in numbers if not re.search(rf"(?<![\d.,]){re.escape(n)}(?![\d])", results))
    assert not missing, f"README speed figures not in docs/RESULTS.md: {missing}"
