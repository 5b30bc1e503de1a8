#!/usr/bin/env bash
# reduce_layout_probe.sh: static cost of the two candidate contract-2 reduction orders on the GPU
# (benchmarks/reduce_layout_probe.cu: (a) lane blocks vs (b) residues, NB = 1 and 16), and the
# CPU tile timing (benchmarks/reduce_layout_tile.cpp) with --cpu. Needs no GPU for the SASS report.
#   bash benchmarks/reduce_layout_probe.sh          SASS report, sm_90 and sm_80 (a few seconds)
#   bash benchmarks/reduce_layout_probe.sh --run    also run the binary (bit check + timing; GPU)
#   bash benchmarks/reduce_layout_probe.sh --cpu    CPU tile benchmark on core 0 instead
# Per kernel and arch it prints registers and spill bytes (ptxas -v), LDL/STL in the whole SASS, and
# the main loop: the backward branch whose body holds the most FFMA, counted from its target label
# to the branch inclusive. Every kernel's loop consumes the weight bytes of its LDGs (width x 32
# lanes; 512 B per iteration here), so "instr/B" = loop instructions / those bytes.
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p build

if [[ "${1:-}" == "--cpu" ]]; then
  g++ -O3 -march=native -ffp-contract=off -std=c++17 -o build/reduce_layout_tile benchmarks/reduce_layout_tile.cpp
  echo "$(date -u '+%Y-%m-%d %H:%M UTC'), $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), core 0"
  exec taskset -c 0 build/reduce_layout_tile
fi

NVCC=${NVCC:-/usr/local/cuda/bin/nvcc}
CUOBJDUMP=${CUOBJDUMP:-$(command -v cuobjdump || find .tools -name cuobjdump -type f | head -1)}
NVDISASM=${NVDISASM:-$(command -v nvdisasm || find .tools -name nvdisasm -type f | head -1)}
export PATH="$(dirname "$NVDISASM"):$PATH"  # cuobjdump -sass needs nvdisasm

bin=build/reduce_layout_probe
"$NVCC" -O3 -std=c++17 --fmad=false -ftz=false -prec-div=true -prec-sqrt=true -Xcompiler -ffp-contract=off \
  -gencode arch=compute_90,code=sm_90 -gencode arch=compute_80,code=sm_80 -Xptxas -v \
  -o "$bin" benchmarks/reduce_layout_probe.cu >build/reduce_layout_probe.ptxas 2>&1 ||
  { cat build/reduce_layout_probe.ptxas; exit 1; }
"$CUOBJDUMP" -sass "$bin" >build/reduce_layout_probe.sass

python3 - build/reduce_layout_probe.ptxas build/reduce_layout_probe.sass <<'EOF'
import re, subprocess, sys
from collections import Counter

def demangle(n):
    d = subprocess.run(["c++filt", n], capture_output=True, text=True).stdout.strip()
    return d.split("(")[0].replace("void ", "")  # e.g. gemv_res_smem<16>

# ptxas -v: registers and spills per (function, arch)
regs = {}
cur = None
for line in open(sys.argv[1]):
    m = re.search(r"Compiling entry function '(\S+)' for '(sm_\d+)'", line)
    if m: cur = (m.group(1), m.group(2)); regs[cur] = {}
    m = re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads", line)
    if m and cur: regs[cur].update(stack=int(m.group(1)), spill=int(m.group(2)) + int(m.group(3)))
    m = re.search(r"Used (\d+) registers", line)
    if m and cur: regs[cur]["regs"] = int(m.group(1))

# SASS: per arch, per function, list of (addr, opcode, text)
funcs = {}
arch = fn = None
for line in open(sys.argv[2]):
    m = re.match(r"arch = (sm_\d+)", line.strip())
    if m: arch = m.group(1)
    m = re.search(r"Function : (\S+)", line)
    if m: fn = (m.group(1), arch); funcs[fn] = []
    m = re.match(r"\s+/\*([0-9a-f]{4,})\*/\s+(.*?);", line)
    if m and fn:
        text = re.sub(r"^@!?U?P\w+\s+", "", m.group(2).strip())  # drop the predicate
        funcs[fn].append((int(m.group(1), 16), text.split()[0], text))

def klass(op):
    base = op.split(".")[0]
    if base == "LDG": return "LDG"
    if base == "LDS": return "LDS"
    if base == "STS": return "STS"
    if base in ("FFMA",): return "FFMA"
    if base in ("FADD", "FMUL"): return "FADD/FMUL"
    if base == "SHFL": return "SHFL"
    if base in ("BAR", "WARPSYNC", "NOP", "BRA", "BSSY", "BSYNC"): return "ctl"
    return "int/move"  # IADD3, IMAD, LEA, SHF, LOP3, PRMT, MOV, ISETP, ...

def ldg_bytes(op):
    w = re.search(r"\.(128|64|U16|S16|U8|S8)\b", op)
    return {"128": 16, "64": 8, "U16": 2, "S16": 2, "U8": 1, "S8": 1}[w.group(1)] if w else 4

classes = ["LDG", "LDS", "STS", "FFMA", "SHFL", "int/move", "ctl"]
print("| kernel | arch | regs | spill B | LDL/STL | loop instr | B/iter | instr/B | " + " | ".join(classes) + " |")
print("|" + "---|" * (8 + len(classes)))
for (name, arch), ins in sorted(funcs.items(), key=lambda f: (f[0][1], demangle(f[0][0]))):
    local = sum(1 for _, op, _ in ins if op.split(".")[0] in ("LDL", "STL"))
    best = None
    for a, op, text in ins:
        m = re.match(r"BRA\s+(?:`\(\.L_x_\d+\)|0x([0-9a-f]+))", text)
        if op.startswith("BRA") and m and m.group(1) and int(m.group(1), 16) < a:
            body = [o for aa, o, _ in ins if int(m.group(1), 16) <= aa <= a]
            nf = sum(1 for o in body if o.startswith("FFMA"))
            if best is None or nf > best[0]: best = (nf, body)
    body = best[1] if best else []
    c = Counter(klass(o) for o in body)
    bpi = 32 * sum(ldg_bytes(o) for o in body if o.startswith("LDG"))
    r = regs.get((name, arch), {})
    print(f"| {demangle(name)} | {arch} | {r.get('regs')} | {r.get('spill')} | {local} | {len(body)} | {bpi} | "
          f"{len(body) / bpi if bpi else float('nan'):.3f} | " + " | ".join(str(c[k]) for k in classes) + " |")
EOF

if [[ "${1:-}" == "--run" ]]; then "$bin"; fi
