"""The user-facing docs claim no more than docs/RESULTS.md records: no GPU run is claimed (README,
CARD.md, docs/RELEASE.md, the package's docstrings) until RESULTS §9 holds one, and every speed
figure in the README's speed table appears in RESULTS."""
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


def gpu_runs_recorded() -> int:
    """Rows of RESULTS §9's run table ('| date | card | ...'); 0 while it says none is recorded."""
    text = (ROOT / "docs" / "RESULTS.md").read_text()
    section = text.split("\n## 9.", 1)[1].split("\n## ", 1)[0]
    lines = section.splitlines()
    head = next((i for i, line in enumerate(lines) if line.replace(" ", "").startswith("|date|card|")), None)
    if head is None:
        assert "GPU runs recorded: none" in section, "RESULTS §9 must hold a '| date | card |' table or say none"
        return 0
    return sum(1 for line in lines[head + 2:] if line.startswith("|"))


def test_claim_detector_can_fail():
    assert claims_gpu_run("Its digests reproduce on an H200 and on every CUDA GPU.")
    assert claims_gpu_run("The megakernel was measured on the GPU at 800 tok/s.")
    assert not claims_gpu_run("The megakernel has not yet run on a GPU.")
    assert not claims_gpu_run("It is compiled for sm_90; no CUDA variant has run on a GPU yet.")


@pytest.mark.parametrize("path", USER_DOCS)
def test_no_gpu_run_claimed_before_results_records_one(path):
    if gpu_runs_recorded():
        pytest.skip("RESULTS §9 records a GPU run")
    text = (ROOT / path).read_text()
    assert not claims_gpu_run(text), f"{path} claims a GPU run that RESULTS §9 does not record"
    if path in ("README.md", "CARD.md"):
        assert NOT_RUN in _flat(text), f"{path} must say plainly that the megakernel has {NOT_RUN}"


def _speed_table(text):
    section = text.split("## Speed", 1)[1].split("\n## ", 1)[0]
    return [line for line in section.splitlines() if line.startswith("|") and not set(line) <= set("|-: ")]


def test_readme_speed_figures_are_in_results():
    """Every number in the README's speed table is one RESULTS.md shows (same run, same rounding)."""
    results = (ROOT / "docs" / "RESULTS.md").read_text()
    rows = _speed_table((ROOT / "README.md").read_text())
    assert len(rows) >= 3, "the README has one speed table, side by side with llama.cpp"
    numbers = {n for row in rows[1:] for n in re.findall(r"\d+(?:\.\d+)?x?", row)}
    missing = sorted(n for n in numbers if not re.search(rf"(?<![\d.]){re.escape(n)}(?![\d])", results))
    assert not missing, f"README speed figures not in docs/RESULTS.md: {missing}"
