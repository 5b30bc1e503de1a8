"""benchmarks/ncu_summary.py: an Nsight Compute profile of one megakernel launch boiled down to a
report's figures and its top stall lines.

Fixtures (tests/data/ncu/), cut from the first H200 run (2026-12-04, the SmolLM2-135M decode step):
- source_small_cut.csv.gz: `ncu -i REPORT --page source --csv --print-source cuda,sass`, keeping the
  header rows and whole CUDA-line blocks (the CUDA row and all its SASS rows, unchanged) of
  crt/sm_70_rt.hpp (all), megakernel/det_mk_warp.cuh:44,63,123, contract/det_bf16.h:7 and
  megakernel/det_simt.h:39,69-77,79,81,83,89,97,110: the barrier line, the asm lines whose unescaped
  quotes and commas the csv module misreads, and instructions that ncu lists under two lines
  (det_bf16.h:7 inlined at det_mk_warp.cuh:63, the nanosleep at det_simt.h:79).
- ncu_small.log: that run's ncu text output, unchanged.
Set NCU_SUMMARY_SAMPLES to a folder with the full ncu_source_small.csv.gz and ncu_small.log to
check the whole profile against the log's own totals too.
"""
import gzip
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "tests" / "data" / "ncu"
sys.path.insert(0, str(ROOT / "benchmarks"))
import ncu_summary as ns  # noqa: E402

SOURCE = DATA / "source_small_cut.csv.gz"
LOG = DATA / "ncu_small.log"


@pytest.fixture(scope="module")
def text():
    return gzip.decompress(SOURCE.read_bytes()).decode()


@pytest.fixture(scope="module")
def rows(text):
    return ns.source_lines(text)


def test_fixture_sizes():
    for p in DATA.iterdir():
        assert p.stat().st_size < 60_000, p


def test_lines_are_cuda_lines_summed_once(rows, text):
    cuda_rows = [ln for ln in text.splitlines() if re.match(r'^"\d+","', ln)]
    assert len(rows) == len(cuda_rows) == 20
    assert all(isinstance(r["line"], int) and r["source"] for r in rows)
    by = {(r["file"], r["line"]): r for r in rows}
    top = by[("megakernel/det_simt.h", 83)]
    # the CUDA row's own figures, not doubled by its 28 SASS rows
    assert top["samples"] == 184223 and top["reasons"]["barrier"] == 180387
    assert sum(top["reasons"].values()) == top["samples"]
    assert top["instructions"] > 0 and set(top) >= {"l2_excess", "l2_sectors", "shared_excess", "shared_wavefronts"}


def test_top_line_is_the_grid_barrier(rows):
    top = ns.top_lines(rows, 5)
    assert len(top) == 5
    first = top[0]
    assert (first["file"], first["line"], first["source"]) == ("megakernel/det_simt.h", 83, "__syncthreads();")
    assert max(first["reasons"], key=first["reasons"].get) == "barrier"
    assert first["reasons"]["barrier"] > 0.95 * first["samples"]
    assert [(r["file"], r["line"]) for r in top[1:3]] == [("megakernel/det_mk_warp.cuh", 44), ("megakernel/det_simt.h", 79)]
    assert [r["samples"] for r in top] == sorted((r["samples"] for r in top), reverse=True)
    assert abs(first["share"] - 100 * 184223 / rows.totals["samples"]) < 1e-9


def test_totals_count_each_instruction_once(rows):
    t = rows.totals
    assert t["deduplicated"]
    assert t["listed"] == sum(r["samples"] for r in rows) == 266308
    # 2,610 samples fall on instructions listed under two lines; the total counts them once
    assert t["samples"] == 263698 and sum(t["reasons"].values()) == t["samples"]
    assert t["l2_sectors"] == 21556254 and t["l2_excess"] == 7368192
    shares = [r["share"] for r in ns.top_lines(rows, len(rows))]
    assert sum(shares) == pytest.approx(100 * t["listed"] / t["samples"])
    assert 100 <= sum(shares) < 101.5  # ~100%, over only by the overlap
    files = t["files"]
    assert set(files) == {"megakernel/det_simt.h", "megakernel/det_mk_warp.cuh", "contract/det_bf16.h",
                          "/usr/local/cuda/include/crt/sm_70_rt.hpp"}
    assert max(files, key=files.get) == "megakernel/det_simt.h"
    assert all(files[f] <= t["samples"] for f in files)


def test_unescaped_quotes_and_commas(rows):
    by = {(r["file"], r["line"]): r for r in rows}
    asm = by[("megakernel/det_simt.h", 89)]
    assert asm["source"] == ('asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\\n" ::"r"(dst), '
                             '"l"(gmem_src) : "memory");')
    assert asm["samples"] == 298 and by[("megakernel/det_simt.h", 97)]["samples"] == 431
    assert by[("/usr/local/cuda/include/crt/sm_70_rt.hpp", 169)]["source"] == 'asm volatile("nanosleep.u32 %0;" :: "r"(ns));'


def test_source_holding_the_delimiter(text):
    # a source line with "," in it splits into extra fields; they go back into the source column
    lines = text.splitlines()
    i = next(k for k, ln in enumerate(lines) if ln.startswith('"83","__syncthreads();"'))
    lines[i] = lines[i].replace('"83","__syncthreads();"', '"83","printf("%d","x"); __syncthreads();"')
    rows = ns.source_lines("\n".join(lines))
    r = next(r for r in rows if r["line"] == 83)
    assert r["source"] == 'printf("%d","x"); __syncthreads();' and r["samples"] == 184223


def test_without_sass_rows(text, rows):
    cuda_only = "\n".join(ln for ln in text.splitlines() if not ln.startswith('"",""'))
    plain = ns.source_lines(cuda_only)
    assert [(r["file"], r["line"], r["samples"]) for r in plain] == [(r["file"], r["line"], r["samples"]) for r in rows]
    assert not plain.totals["deduplicated"] and plain.totals["samples"] == plain.totals["listed"]
    assert "No SASS rows" in ns.markdown(plain)


def test_paths_relative_to_the_repository(text):
    assert ns.repo_path("/tmp/x/megakernel/det_simt.h") == "megakernel/det_simt.h"
    assert ns.repo_path("/home/model/build/megakernel/det_simt.h") == "megakernel/det_simt.h"
    assert ns.repo_path("/nix/store/abc-source/contract/det_round.h") == "contract/det_round.h"
    assert ns.repo_path("../megakernel/det_simt.h") == "megakernel/det_simt.h"
    assert ns.repo_path("contract/det_round.h") == "contract/det_round.h"
    assert ns.repo_path("/usr/local/cuda/include/crt/sm_70_rt.hpp") == "/usr/local/cuda/include/crt/sm_70_rt.hpp"
    assert ns.repo_path("/opt/other/thing.h") == "/opt/other/thing.h"
    prefixed = re.sub(r'^"File Path","(?!/)', '"File Path","/tmp/build-1/det-infer/', text, flags=re.M)
    assert prefixed != text
    assert {r["file"] for r in ns.source_lines(prefixed)} == {r["file"] for r in ns.source_lines(text)}


def test_sections():
    s = ns.sections(LOG.read_text())
    assert s["Duration"] == (2.62, "ms")
    assert s["DRAM Throughput"] == (2.18, "%")
    assert s["Memory Throughput"] == (4.61, "%") and s["Compute (SM) Throughput"] == (5.72, "%")
    assert s["Warp Cycles Per Issued Instruction"] == (34.58, "cycle")
    assert s["Elapsed Cycles"] == (5176660, "cycle") and s["SM Active Cycles"] == (5154745.6, "cycle")
    assert s["Avg. Active Threads Per Warp"] == (25.26, "")
    assert s["Branch Instructions"] == (20246797, "inst")
    assert s["Kernel"] == ("det_mk_kernel(det_mk_params)", "") and s["Launch"] == ("(132, 1, 1)x(256, 1, 1)", "")
    assert len(s) == 2 + 10 + 4 + 4  # the launch, SpeedOfLight, WarpStateStats, SourceCounters; no prose
    assert ns.sections("") == {} and ns.sections("a,b\n1,2\n") == {}


def test_markdown(rows):
    md = ns.markdown(rows, ns.sections(LOG.read_text()), n=5)
    lines = md.splitlines()
    assert "| figure | value |" in lines
    assert "| Duration | 2.62 ms |" in lines and "| DRAM Throughput | 2.18 % |" in lines
    assert "| L2 Cache Throughput | 3.49 % |" in lines and "| L1/TEX Cache Throughput | 4.62 % |" in lines
    assert "| Warp Cycles Per Issued Instruction | 34.58 cycle |" in lines
    assert "| Global sectors excess | 34.2% (7,368,192 of 21,556,254) |" in lines
    assert any(ln.startswith("| Shared wavefronts excess | ") for ln in lines)
    assert not any("Achieved Occupancy" in ln for ln in lines)  # not in this log
    f, t = lines.index("| share | file |"), lines.index("| share | file:line | source | top reasons |")
    assert f < t and lines[f + 2] == "| 80.0% | megakernel/det_simt.h |"
    table = [ln for ln in lines[t + 2:] if ln.startswith("| ")]
    assert len(table) == 5
    assert table[0] == "| 69.9% | megakernel/det_simt.h:83 | `__syncthreads();` | barrier 180,387, branch_resolving 2,461, wait 387 |"
    assert all(ln.count(" | ") == 3 for ln in table)
    assert "add up to 101.0%" in md
    assert ns.markdown(rows).count("megakernel/det_simt.h:") > 5  # no log; 25 lines by default


def test_markdown_cells():
    row = {"file": "megakernel/det_simt.h", "line": 1, "source": "if (a || b) { " + "x" * 100, "samples": 10,
           "reasons": {"wait": 7, "barrier": 3}, "instructions": 1, "l2_excess": 0, "l2_sectors": 0,
           "shared_excess": 0, "shared_wavefronts": 0}
    md = ns.markdown([row])
    line = next(ln for ln in md.splitlines() if ":1 |" in ln)
    assert "`if (a \\|\\| b) {" in line and "..." in line
    cell = line.split(" | ")[2]
    assert len(cell.replace("\\|", "|").strip("`")) <= 60
    assert line.endswith("| wait 7, barrier 3 |") and line.startswith("| 100.0% |")


def test_cli(tmp_path, capsys):
    assert ns.main(["--source", str(SOURCE), "--log", str(LOG), "--top", "3"]) == 0
    out = capsys.readouterr().out
    assert "| Duration | 2.62 ms |" in out and "megakernel/det_simt.h:83" in out
    assert "megakernel/det_simt.h:70" not in out  # the 7th line, beyond --top 3
    plain = tmp_path / "source.csv"
    plain.write_text(gzip.decompress(SOURCE.read_bytes()).decode())
    assert ns.main(["--source", str(plain)]) == 0
    assert "| 69.9% | megakernel/det_simt.h:83 |" in capsys.readouterr().out


@pytest.mark.parametrize("content", [b"", b"a,b,c\n1,2,3\n", b'"x","y"\n"1","2"\n', gzip.compress(b"a,b\n1,2\n"),
                                     b'"Line No","Source","Address","Source","Instructions Executed"\n', b"\x1f\x8bnot gzip"])
def test_cli_rejects_what_is_not_a_source_page(tmp_path, capsys, content):
    bad = tmp_path / "bad.csv"
    bad.write_bytes(content)
    assert ns.main(["--source", str(bad)]) == 2
    err = capsys.readouterr()
    assert err.out == "" and len(err.err.strip().splitlines()) == 1 and str(bad) in err.err
    assert err.err.startswith("ncu_summary: error: ")


def test_cli_missing_files(tmp_path, capsys):
    assert ns.main(["--source", str(tmp_path / "none.csv")]) == 2
    assert "no such file" in capsys.readouterr().err
    assert ns.main(["--source", str(SOURCE), "--log", str(tmp_path / "none.log")]) == 2
    err = capsys.readouterr()
    assert err.out == "" and "none.log: no such file" in err.err


def test_script_runs():
    r = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "ncu_summary.py"), "--source", str(SOURCE),
                        "--log", str(LOG), "--top", "2"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert len(re.findall(r"^\| [\d.]+% \| \S+:\d+ \|", r.stdout, re.M)) == 2
    r = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "ncu_summary.py"), "--source", str(LOG)],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "is not an ncu source CSV" in r.stderr and r.stdout == ""


@pytest.mark.skipif(not os.environ.get("NCU_SUMMARY_SAMPLES"), reason="NCU_SUMMARY_SAMPLES not set")
def test_whole_profile_agrees_with_the_log():
    d = Path(os.environ["NCU_SUMMARY_SAMPLES"])
    rows = ns.source_lines(gzip.decompress((d / "ncu_source_small.csv.gz").read_bytes()).decode())
    log = (d / "ncu_small.log").read_text()
    t = rows.totals
    # the log's SourceCounters: "12457880 excessive sectors (35% of the total 35883222 sectors)", and
    # "7712352 excessive wavefronts (49% of the total 15646687 wavefronts)"
    assert f"{t['l2_excess']} excessive sectors" in log and f"total {t['l2_sectors']} sectors" in log
    assert f"{t['shared_excess']} excessive wavefronts" in log and f"total {t['shared_wavefronts']} wavefronts" in log
    # WarpStateStats: the barrier stall "represents about 68.1%" of the cycles between issues
    assert f"{100 * t['reasons']['barrier'] / t['samples']:.1f}%" == "68.1%"
