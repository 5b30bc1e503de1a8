"""Every repository path that a comment or a doc names exists, and every section reference names
a section that exists.

The scan covers the repository's text files (git's tracked and not-ignored files: *.md, *.py, *.h,
*.cuh, *.cu, *.cpp, *.sh, *.toml) line by line, comments, docstrings, code and docs alike:
- a token that starts with a top-level directory (contract/..., det_infer_cpu/..., docs/..., ...)
  must exist in the working tree (a trailing "/" names a directory);
- a relative reference to one of the project's own sources (../contract/det_act.h,
  x86/det_gemv_avx2.cpp, det_infer/config.py) must be the tail of a file in the tree;
- a bare file name ending in .md must be a top-level file or one in docs/, and documents kept
  outside the repository (OUTSIDE_DOCS: the design brief) are never named: a reader of the
  repository cannot open them (docs/SPEC.md is the reference);
- "docs/SPEC.md §N", "SPEC §N.M", "RESULTS §N", "docs/RESULTS.md §N/§M" must name a heading of that
  document ("## N." or "### N.M"). A bare "§N" refers to the file's own document in docs/SPEC.md and
  docs/RESULTS.md, to SPEC in source files, and in other docs to either one. A reference may wrap
  to the next line ("SPEC" at the end of one, "§2.5" at the start of the next).
Globs and placeholders (benchmarks/benchmark*.py, build/<variant>/) and generated paths (build/,
.venv/, .tools/, __pycache__, the build's registration.h and _ops.py) are not checked.
"""
import bisect
import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SUFFIXES = (".md", ".py", ".h", ".cuh", ".cu", ".cpp", ".sh", ".toml")
# Top-level directories; the scan adds whatever else the tree holds.
TOP_DIRS = {".ci", "benchmarks", "contract", "det_infer_cpu", "det_infer_cuda", "docs", "megakernel", "scripts",
            "tests", "torch-ext"}
# Build outputs and caches (git-ignored, or written by scripts/build_local.py): never in a checkout.
GENERATED_PARTS = {"build", ".venv", ".tools", ".whl", "__pycache__", ".pytest_cache", ".git", "result"}
GENERATED_NAMES = {"registration.h", "_ops.py", "metadata.json"}
# Documents that live outside the repository.
OUTSIDE_DOCS = ("DESIGN" ".md",)  # spelled in two pieces: this line is scanned too
# Intentional exceptions: (file that names it, path as named). Keep it short, each with its reason.
# Empty at present: the paths named on purpose without existing (test_release_layout.py's
# must-never-be-committed examples) are generated ones, covered by the two sets above.
ALLOWED_MISSING = set()

_STRIP = ".,;:)]}'\"`-"
_PATH_CHARS = r"[\w./*<>{}\[\]-]"
_REL_RE = re.compile(r"(?<![\w./$~-])((?:\.\./)*(?:[\w-]+/)*(?:det_\w+\.(?:h|cuh|cu|cpp)|det_infer/[\w/]+\.py))\b")
_MD_RE = re.compile(r"(?<![\w./$~-])([\w-]+\.md)\b")
_SECTION_RE = re.compile(r"§+\s?(\d+(?:\.\d+)*)")
_CHAIN_RE = re.compile(r"\b(?:docs/)?(SPEC|RESULTS)(?:\.md)?,?\s*((?:§+\s?\d+(?:\.\d+)*(?:\s*(?:,|/|and|or)\s*)?)+)")
_LEAD_RE = re.compile(r"^\s*(?://+|#+|\*+|\"\"\")?\s*")  # indentation and a comment marker
_HEADING_RE = re.compile(r"^#{2,4}\s+(\d+(?:\.\d+)*)\.?\s", re.M)


def repo_files(root=ROOT):
    """The text files to scan: git's tracked and untracked-but-not-ignored files (a new doc counts
    before it is committed), or a walk of the tree outside git."""
    try:
        out = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"], cwd=root,
                             capture_output=True, text=True, check=True).stdout.split("\n")
    except (OSError, subprocess.CalledProcessError):
        out = [str(p.relative_to(root)) for p in root.rglob("*")
               if p.is_file() and not GENERATED_PARTS & set(p.relative_to(root).parts)]
    return sorted({f for f in out if f.endswith(SUFFIXES) and (root / f).is_file()})


def section_numbers(path):
    """The section numbers of a markdown document's numbered headings ("## 5." -> "5", "### 2.1" -> "2.1")."""
    return set(_HEADING_RE.findall(path.read_text())) if path.is_file() else set()


class Context:
    def __init__(self, root=ROOT, files=None):
        self.root = root
        self.files = repo_files(root) if files is None else files
        self.top_dirs = TOP_DIRS | {f.split("/")[0] for f in self.files if "/" in f}
        self.path_re = re.compile(r"(?<![\w./$~@-])((?:%s)/%s*)" % ("|".join(map(re.escape, sorted(self.top_dirs))),
                                                                     _PATH_CHARS))
        self.sections = {"SPEC": section_numbers(root / "docs" / "SPEC.md"),
                         "RESULTS": section_numbers(root / "docs" / "RESULTS.md")}

    def exists(self, rel):
        return (self.root / rel).exists()

    def default_doc(self, relpath):
        """Which document a bare §N in this file refers to."""
        if relpath == "docs/RESULTS.md":
            return ("RESULTS",)
        if relpath.endswith(".md") and relpath != "docs/SPEC.md":
            return ("SPEC", "RESULTS")
        return ("SPEC",)


def _skipped(token):
    parts = token.split("/")
    return (any(c in token for c in "*<>{}[]") or "..." in token or GENERATED_PARTS & set(parts)
            or parts[-1] in GENERATED_NAMES)


def scan_text(relpath, text, ctx):
    """Problems in one file's text: (kind, "file:line", token, why)."""
    problems = []
    for n, line in enumerate(text.splitlines(), 1):
        where = f"{relpath}:{n}"
        for m in ctx.path_re.finditer(line):
            token = m.group(1).rstrip(_STRIP)
            if _skipped(token) or (relpath, token) in ALLOWED_MISSING:
                continue
            if not ctx.exists(token):
                problems.append(("path", where, token, "no such file or directory"))
        for m in _REL_RE.finditer(line):
            token = m.group(1)
            bare = re.sub(r"^(\.\./)+", "", token)
            if bare.split("/")[0] in ctx.top_dirs or _skipped(bare) or (relpath, token) in ALLOWED_MISSING:
                continue  # a full path: checked above
            if not any(f == bare or f.endswith("/" + bare) for f in ctx.files) and not ctx.exists(bare):
                problems.append(("path", where, token, "no file of the repository ends with this path"))
        for m in _MD_RE.finditer(line):
            token = m.group(1)
            if token in OUTSIDE_DOCS:
                problems.append(("path", where, token, "kept outside the repository; refer to docs/SPEC.md"))
            elif not (ctx.exists(token) or ctx.exists("docs/" + token)) and (relpath, token) not in ALLOWED_MISSING:
                problems.append(("path", where, token, "neither a top-level file nor one in docs/"))
    problems += _scan_sections(relpath, text, ctx)
    return problems


def _scan_sections(relpath, text, ctx):
    """Section references, over the text with its lines joined (comment markers dropped), so that
    "SPEC" at the end of one line and "§2.5" at the start of the next are one reference."""
    flat, starts = [], []
    pos = 0
    for line in text.splitlines():
        starts.append(pos)
        stripped = _LEAD_RE.sub("", line)
        flat.append(stripped)
        pos += len(stripped) + 1
    flat = " ".join(flat)

    def where(offset):
        return f"{relpath}:{bisect.bisect_right(starts, offset)}"

    problems, chained = [], set()
    for m in _CHAIN_RE.finditer(flat):
        doc = m.group(1)
        for s in _SECTION_RE.finditer(m.group(2)):
            chained.add(m.start(2) + s.start())
            if s.group(1) not in ctx.sections[doc]:
                problems.append(("section", where(m.start(2) + s.start()), f"{doc} §{s.group(1)}",
                                 f"docs/{doc}.md has no such heading"))
    docs = ctx.default_doc(relpath)
    for s in _SECTION_RE.finditer(flat):
        if s.start() not in chained and not any(s.group(1) in ctx.sections[d] for d in docs):
            problems.append(("section", where(s.start()), f"§{s.group(1)}",
                             f"no such heading in {' or '.join(f'docs/{d}.md' for d in docs)}"))
    return problems


def scan_repository(ctx=None):
    ctx = ctx or Context()
    problems = []
    for f in ctx.files:
        problems += scan_text(f, (ctx.root / f).read_text(errors="replace"), ctx)
    return problems


def _report(problems):
    return "\n".join(f"{where}: {token!r}: {why}" for _, where, token, why in problems)


_CTX = None


def _ctx():
    global _CTX
    if _CTX is None:
        _CTX = Context()
    return _CTX


def test_every_named_path_exists():
    problems = [p for p in scan_repository(_ctx()) if p[0] == "path"]
    assert not problems, "paths named in comments or docs that do not exist:\n" + _report(problems)


def test_every_section_reference_exists():
    ctx = _ctx()
    assert {"1", "2.5", "13.7", "16"} <= ctx.sections["SPEC"], "docs/SPEC.md's headings were not found"
    assert ctx.sections["RESULTS"], "docs/RESULTS.md's numbered headings were not found"
    problems = [p for p in scan_repository(ctx) if p[0] == "section"]
    assert not problems, "section references to headings that do not exist:\n" + _report(problems)


def test_the_scanner_flags_what_it_should():
    """The checks can fail: made-up references (spelled in pieces, so this file itself stays clean)."""
    ctx = _ctx()
    missing = "/".join(["contract", "det_" + "nowhere.h"])
    outside = "DESIGN" + ".md"
    text = "\n".join([
        f"// the formula of {missing} ({outside} §2)",             # 1: a missing file, an outside doc
        "// x86/det_" + "nowhere_avx2.cpp and det_infer/" + "gone.py",  # 2: relative references, missing
        "# docs/SPEC.md §" + "99, SPEC §" + "13.9, RESULTS §" + "5/§" + "77",  # 3: missing sections
        "// contract/det_act.h, x86/det_gemv_avx2.cpp, docs/SPEC.md §13.7, RESULTS §1, scripts/",  # 4: fine
        "// benchmarks/benchmark*.py, build/<variant>/_ops.py, tests/__pycache__/a.pyc, .venv/bin",  # 5: skipped
        "// see https://example.org/tests/none.py and $OUT/docs/none.md",  # 6: not repository paths
    ])
    found = {(where.split(":")[1], token) for _, where, token, _ in scan_text("made_up.h", text, ctx)}
    assert found == {("1", missing), ("1", outside), ("2", "x86/det_" + "nowhere_avx2.cpp"),
                     ("2", "det_infer/" + "gone.py"), ("3", "SPEC §" + "99"), ("3", "SPEC §" + "13.9"),
                     ("3", "RESULTS §" + "77")}, found
    # A bare section reference is checked too, against the file's own document.
    bare = "see §" + "99"
    assert scan_text("docs/SPEC.md", bare, ctx) and scan_text("README.md", bare, ctx)
    assert not scan_text("README.md", "see §1", ctx)
    # A reference wrapped after the document's name is still that document's.
    assert not scan_text("docs/RESULTS.md", "the expansions (SPEC\n  §2.5)", ctx)
    assert [p[2] for p in scan_text("x.h", "// docs/RESULTS.md\n// §2.5", ctx)] == ["RESULTS §" + "2.5"]
