#!/usr/bin/env python3
"""Boils an Nsight Compute profile of one megakernel launch down to what a report needs: a few
figures (duration, throughputs, cycles per issued instruction, occupancy, coalescing) and the
source lines with the most warp stall samples, with their top stall reasons, as markdown.

    python3 benchmarks/ncu_summary.py --source SOURCE.csv[.gz] [--log NCU.log] [--top 25]

Inputs (both from the same `ncu` report; the binary built with -lineinfo, or lines are missing):
- SOURCE.csv: `ncu -i REPORT --page source --csv --print-source cuda,sass` (gzip or not). Per
  source file a block: `"File Path",...`, `"Function Name",...`, a header row (`"Line No","Source",
  "Address","Source",...`), then one row per CUDA line (Line No set) followed by the rows of the
  SASS instructions ncu maps to it (Line No empty, an address; `...` rows mark gaps). A CUDA row is
  the sum of its SASS rows, so only CUDA rows are summed per line. ncu writes the fields quoted but
  does not escape quotes inside them (`"asm volatile("nanosleep.u32 %0;" ...);"`), so rows are split
  on `","` here, not with the csv module (which misreads such rows).
- NCU.log: ncu's text output with the SpeedOfLight and WarpStateStats sections (Occupancy and
  LaunchStats too where collected): `name  unit  value` tables.

Inlining: ncu lists an inlined instruction under more than one CUDA line (for example the fma in
contract/det_round.h:70 and the loop in megakernel/det_mk_warp.cuh:123 that calls it), so per-line
counts overlap. Totals (all stall samples, per-reason, per-file, sectors and wavefronts) count
each SASS instruction once, by address; they agree with ncu's own totals in the log (sectors,
wavefronts, the barrier share of WarpStateStats). A line's share is its samples over that total;
the shares of all lines then add up to more than 100% by the overlap, which the markdown states.
A CSV without SASS rows (--print-source cuda) falls back to summing the lines.

Paths print relative to the repository (a build prefix such as /tmp/x/ is stripped:
/tmp/x/megakernel/det_simt.h -> megakernel/det_simt.h); system paths (/usr/local/cuda/...) stay.

How the device check uses it: its `ncu` stage (scripts/device_check.sh) profiles one decode step,
one megakernel launch (the first H200 run used `ncu --clock-control none -k regex:det_mk
--launch-skip 4 --launch-count 1 --section SpeedOfLight --section WarpStateStats --section
SourceCounters -o REPORT ...`, keeping ncu's text output as the log), exports the source page as
above, and calls this script with both; the markdown it prints goes into the report.
Exit status: 0, or 2 with a one-line message when an input is missing or is not what ncu writes.
Standard library only.
"""
import argparse
import gzip
import posixpath
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# The repository's source directories: a path is cut to start at one of them.
TOP_DIRS = ("megakernel", "contract", "det_infer_cuda", "det_infer_cpu", "model", "torch-ext",
            "det_fixtures", "benchmarks", "tests")
STALLS = "Warp Stall Sampling (All Samples)"
METRICS = {  # row key -> ncu column
    "instructions": "Instructions Executed",
    "l2_excess": "L2 Theoretical Sectors Global Excessive",
    "l2_sectors": "L2 Theoretical Sectors Global",
    "shared_excess": "L1 Wavefronts Shared Excessive",
    "shared_wavefronts": "L1 Wavefronts Shared",
}
FIGURES = ("Duration", "DRAM Throughput", "Memory Throughput", "L2 Cache Throughput", "L1/TEX Cache Throughput",
           "L1/TEX Hit Rate", "L2 Hit Rate", "Compute (SM) Throughput", "Warp Cycles Per Issued Instruction",
           "Achieved Occupancy", "Theoretical Occupancy", "Registers Per Thread")  # those the log has


class InputError(ValueError):
    """An input that is not what ncu writes."""


class SourceLines(list):
    """source_lines()'s list of per-line dicts, with .totals: the whole profile, each SASS
    instruction counted once (see the module docstring)."""
    totals = None


def repo_path(path, root=ROOT):
    """`path` relative to the repository where it names one of its files under a build prefix;
    system and unknown paths unchanged."""
    p = path.replace("\\", "/")
    if p.startswith("/usr/"):
        return p
    parts = [x for x in posixpath.normpath(p).split("/") if x not in ("", ".", "..")]
    starts = [i for i, x in enumerate(parts[:-1]) if x in TOP_DIRS]
    for i in starts:  # the longest tail that is a file here
        if (root / "/".join(parts[i:])).is_file():
            return "/".join(parts[i:])
    if starts:  # not in this checkout: the shortest tail that starts at a source directory
        return "/".join(parts[starts[-1]:])
    return path


def _fields(line, width=None):
    """One row's fields: every field is quoted, quotes inside are not escaped. Where the source
    text itself holds `","`, the surplus is joined back into the source column."""
    line = line.rstrip("\r\n")
    if len(line) < 2 or line[0] != '"' or line[-1] != '"':
        return None
    f = line[1:-1].split('","')
    if width and len(f) > width:
        extra = len(f) - width
        col = 1 if f[0] else 3  # CUDA source or SASS text
        f[col:col + extra + 1] = ['","'.join(f[col:col + extra + 1])]
    return f


def _num(s):
    """A CSV cell as a number (0 when it is not one)."""
    v = _value(s)
    return v if isinstance(v, (int, float)) else 0


def _zero():
    return {"samples": 0, "reasons": {}, **{k: 0 for k in METRICS}}


def _add(into, counts):
    into["samples"] += counts["samples"]
    for r, v in counts["reasons"].items():
        into["reasons"][r] = into["reasons"].get(r, 0) + v
    for k in METRICS:
        into[k] += counts[k]


def source_lines(csv_text):
    """Per CUDA source line: dicts with file, line, source, samples, reasons (reason -> samples,
    without the stall_ prefix, zeros left out), instructions, l2_excess, l2_sectors, shared_excess,
    shared_wavefronts; ordered by file as ncu lists them, then line. Raises InputError when the
    text is not an ncu source page. The list's .totals: samples, reasons and the metrics over all
    SASS instructions once each, files (file -> samples of its instructions), listed (the sum of
    the lines' samples), deduplicated (False when there were no SASS rows to count by)."""
    header = cols = reason_cols = None
    file = function = None
    by_line, order = {}, []
    seen = {}  # (function, address) -> counts, each SASS instruction once
    file_addrs = {}  # file -> set of (function, address)
    current, current_has_sass, orphans = None, False, []
    for raw in csv_text.splitlines():
        f = _fields(raw, len(header) if header else None)
        if not f:
            continue
        if f[0] == "File Path" and len(f) >= 2:
            file, function = repo_path('","'.join(f[1:])), None
            file_addrs.setdefault(file, set())
            continue
        if f[0] == "Function Name" and len(f) >= 2:
            function = '","'.join(f[1:])
            continue
        if f[0] == "Line No":
            if STALLS not in f:
                raise InputError(f"its header has no {STALLS!r} column")
            header = f
            cols = {}
            for i, name in enumerate(f):
                cols.setdefault(name, i)
            reason_cols = {name[len("stall_"):]: i for name, i in cols.items()
                           if name.startswith("stall_") and "(" not in name}
            f = None
            continue
        if header is None or file is None or len(f) != len(header):
            continue

        def counts(row):
            c = {"samples": _num(row[cols[STALLS]]), "reasons": {}}
            for r, i in reason_cols.items():
                v = _num(row[i])
                if v:
                    c["reasons"][r] = v
            for k, name in METRICS.items():
                c[k] = _num(row[cols[name]]) if name in cols else 0
            return c

        if f[0]:  # a CUDA line
            if current is not None and not current_has_sass:
                orphans.append(current)
            key = (file, _num(f[0]))
            row = by_line.get(key)
            if row is None:
                row = by_line[key] = {"file": file, "line": key[1], "source": f[1].strip(), **_zero()}
                order.append(key)
            c = counts(f)
            _add(row, c)
            current, current_has_sass = (file, c), False
        elif f[2] and f[2] != "..." and current is not None:  # a SASS instruction of the line above
            current_has_sass = True
            addr = (function, f[2])
            file_addrs[file].add(addr)
            if addr not in seen:
                seen[addr] = counts(f)
    if header is None:
        raise InputError("no ncu source page header (\"Line No\",\"Source\",\"Address\",...)")
    if current is not None and not current_has_sass:
        orphans.append(current)

    totals = _zero()
    for c in seen.values():
        _add(totals, c)
    files = {fl: sum(seen[a]["samples"] for a in addrs) for fl, addrs in file_addrs.items()}
    for fl, c in orphans:  # lines listed without instructions: counted as they are
        _add(totals, c)
        files[fl] = files.get(fl, 0) + c["samples"]
    totals["files"] = {fl: s for fl, s in files.items() if s}
    totals["deduplicated"] = bool(seen)
    rows = SourceLines(by_line[k] for k in order)
    totals["listed"] = sum(r["samples"] for r in rows)
    rows.totals = totals
    return rows


def _totals(rows):
    t = getattr(rows, "totals", None)
    if t is not None:
        return t
    t = _zero()
    files = {}
    for r in rows:
        _add(t, r)
        files[r["file"]] = files.get(r["file"], 0) + r["samples"]
    t.update(files=files, listed=t["samples"], deduplicated=False)
    return t


def top_lines(rows, n=25):
    """The n lines with the most stall samples, most first, each a copy with share added (percent
    of all stall samples of the profile)."""
    total = _totals(rows)["samples"] or 1
    best = sorted(rows, key=lambda r: (-r["samples"], r["file"], r["line"]))[:n]
    return [{**r, "share": 100.0 * r["samples"] / total} for r in best if r["samples"] > 0]


_SEP = re.compile(r"^\s*-{3,}(?: +-{3,})+\s*$")
_LAUNCH = re.compile(r"^\s+(\S.*\)) (\(\d+, \d+, \d+\)x\(\d+, \d+, \d+\)), Context \d+")


def _value(s):
    t = s.replace(",", "")
    try:
        return int(t)
    except ValueError:
        try:
            return float(t)
        except ValueError:
            return s


def sections(log_text):
    """ncu's text output -> {metric name: (value, unit)}: every row of every section's
    `Metric Name / Metric Unit / Metric Value` table (value a number where it is one; unit "" where
    none), plus "Kernel" and "Launch" (grid x block) from the launch line. The first profiled launch
    wins where the log holds several."""
    out = {}
    spans, header, in_rows = None, False, False
    for line in log_text.splitlines():
        m = _LAUNCH.match(line)
        if m:
            out.setdefault("Kernel", (m.group(1), ""))
            out.setdefault("Launch", (m.group(2), ""))
            continue
        if _SEP.match(line):
            if in_rows:
                spans, header, in_rows = None, False, False
            elif spans and header:
                in_rows = True
            else:
                spans = [mm.start() for mm in re.finditer(r"-+", line)]
                header = False
            continue
        if spans and not in_rows:
            header = "Metric Name" in line
            if not header:
                spans = None
            continue
        if in_rows and len(spans) >= 3 and line.strip():
            name = line[:spans[1]].strip()
            unit = line[spans[1]:spans[2]].strip()
            value = line[spans[2]:].strip()
            if name and value:
                out.setdefault(name, (_value(value), unit))
    return out


def _fmt_value(v):
    if isinstance(v, float) and v.is_integer():
        v = int(v)
    return f"{v:,}" if isinstance(v, (int, float)) else str(v)


def _pct(part, whole):
    return f"{100.0 * part / whole:.1f}%" if whole else "-"


def _cell(text, limit=60):
    text = " ".join(text.split())
    if len(text) > limit:
        text = text[:limit - 3].rstrip() + "..."
    text = text.replace("|", "\\|")
    if not text:
        return ""
    tick = "``" if "`" in text else "`"
    pad = " " if tick == "``" else ""
    return f"{tick}{pad}{text}{pad}{tick}"


def _reasons(reasons, k=3):
    best = sorted(reasons.items(), key=lambda kv: (-kv[1], kv[0]))[:k]
    return ", ".join(f"{r} {_fmt_value(v)}" for r, v in best)


def markdown(rows, sections=None, n=25):
    """The report: a figures table (from the log where given, and the source page's totals), the
    per-file shares of stall samples, and `| share | file:line | source | top reasons |` for the n
    lines with the most samples."""
    sec = sections or {}
    t = _totals(rows)
    total = t["samples"]
    out = []
    if "Kernel" in sec:
        out += [f"ncu: `{sec['Kernel'][0]}` {sec.get('Launch', ('', ''))[0]}".rstrip(), ""]
    out += ["| figure | value |", "|---|---|"]
    for name in FIGURES:
        if name in sec:
            v, unit = sec[name]
            out.append(f"| {name} | {_fmt_value(v)}{' ' + unit if unit else ''} |")
    out.append(f"| Global sectors excess | {_pct(t['l2_excess'], t['l2_sectors'])} "
               f"({_fmt_value(t['l2_excess'])} of {_fmt_value(t['l2_sectors'])}) |")
    out.append(f"| Shared wavefronts excess | {_pct(t['shared_excess'], t['shared_wavefronts'])} "
               f"({_fmt_value(t['shared_excess'])} of {_fmt_value(t['shared_wavefronts'])}) |")
    out.append(f"| Warp stall samples | {_fmt_value(total)} |")
    if total:
        best = sorted(t["reasons"].items(), key=lambda kv: (-kv[1], kv[0]))[:5]
        out.append("| Stall reasons | " + ", ".join(f"{r} {_pct(v, total)}" for r, v in best) + " |")
    out += ["", "| share | file |", "|---|---|"]
    for fl, s in sorted(t["files"].items(), key=lambda kv: (-kv[1], kv[0])):
        if total and 1000 * s >= total:  # 0.1% and up
            out.append(f"| {_pct(s, total)} | {fl} |")
    out += ["", "| share | file:line | source | top reasons |", "|---|---|---|---|"]
    for r in top_lines(rows, n):
        out.append(f"| {r['share']:.1f}% | {r['file']}:{r['line']} | {_cell(r['source'])} | {_reasons(r['reasons'])} |")
    over = t["listed"] - total
    if t["deduplicated"] and over > 0:
        out += ["", f"Shares are of all {_fmt_value(total)} stall samples, each instruction once; ncu lists "
                    f"inlined instructions under more than one line (and file), so the lines' shares add up to "
                    f"{_pct(t['listed'], total)}."]
    elif not t["deduplicated"]:
        out += ["", "No SASS rows in the source page: totals are the lines' sums and count inlined "
                    "instructions once per line that lists them."]
    return "\n".join(out) + "\n"


def _read(path, what):
    p = Path(path)
    if not p.is_file():
        raise InputError(f"{what} {path}: no such file")
    data = p.read_bytes()
    if data[:2] == b"\x1f\x8b":
        try:
            data = gzip.decompress(data)
        except (OSError, EOFError) as e:
            raise InputError(f"{what} {path}: bad gzip ({e})") from None
    return data.decode("utf-8", errors="replace")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--source", required=True, help="ncu --page source --csv --print-source cuda,sass output (.gz or not)")
    ap.add_argument("--log", help="ncu's text output (SpeedOfLight, WarpStateStats sections)")
    ap.add_argument("--top", type=int, default=25, help="lines in the table (default 25)")
    a = ap.parse_args(argv)
    try:
        text = _read(a.source, "source CSV")
        try:
            rows = source_lines(text)
        except InputError as e:
            raise InputError(f"{a.source} is not an ncu source CSV: {e}") from None
        sec = {}
        if a.log:
            sec = sections(_read(a.log, "ncu log"))
            if not sec:
                print(f"ncu_summary: warning: no metric tables in {a.log}", file=sys.stderr)
    except InputError as e:
        print(f"ncu_summary: error: {e}", file=sys.stderr)
        return 2
    sys.stdout.write(markdown(rows, sec, a.top))
    return 0


if __name__ == "__main__":
    sys.exit(main())
