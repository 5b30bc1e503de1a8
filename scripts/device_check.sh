#!/usr/bin/env bash
# The GPU check: one run on a lent GPU machine (about 15 minutes of device time, once), built so
# that it cannot fail on setup and always leaves a report. Stages, in order, each one function
# below, each under its own `timeout`, all under one deadline (DET_CHECK_DEADLINE, 480 s):
#
#   stage      budget s  expected s on the H200 machine (16 cores), and its basis
#   preflight       30   10  pip installs ~30 wheels (--no-deps, no compile); torch and CUDA init;
#                            wheels from .whl/ (only what the device lacks), every version, the GPU
#                            and its capability, nvcc == torch's CUDA major, disk; fails fast,
#                            naming what is missing
#   build          180   60  CPU and CUDA variants at once (~36 compile jobs on 16 cores; the longest,
#                            a torch binding, ~35 s on a loaded core here; the megakernel for one
#                            arch 24 s here), the CUDA one for this GPU's arch only (DET_CUDA_ARCHS,
#                            default: the GPU's capability); registers and stack of the binary
#   smoke           60   10  a tiny model at grid 2, then at the default geometry, bits against the
#                            CPU engine: a hang or a launch failure shows here, within a minute
#   geometry        20    8  the launcher's default geometry, probed (~25 launches of a tiny model)
#   digests         90   50  pinned digests of every synthetic model, then tests/test_cuda_device.py
#                            and the CPU contract tests (27 s of them on 2 cores here)
#   bench           50   20  benchmarks/bench_gpu.py (decode tok/s, b1 and b16), SM clock sampled;
#                            a row per model as it finishes (over budget only below ~3% of the
#                            copy bandwidth)
#   profile        210  120  benchmarks/gpu_profile.py: per-step ms against layers, context (~50,
#                            ~1,000, ~4,000; attn 0 and 32) and batch 16, prefill tok/s of 16- and
#                            1,000-token prompts, batch 1 and 16 and the long prefill with geometry
#                            ahead 16, batch 1 and 16 with barrier 1, the same three with outs 4,
#                            batch 1 and 16 with stage 1, the long prefill with tile_rows 64,
#                            every switch at once (batch 1, 4, 8, 16 and the long prefill; ~20 s
#                            more), the phase timeline, then score_batch of 16 pairs (96 + 32
#                            tokens) at the default and with every switch, beside the CPU engine
#                            on the device's cores (SmolLM2; ~25 s more), then seeded sampling's
#                            per-step ms at batch 1 and 16 beside greedy (4 steps; the rows stop
#                            after one over 8 s); each beside gpu_model.py's prediction
#   peers           60   30  benchmarks/peer_torch.py: a stock PyTorch decode step of the same shapes
#                            as a CUDA graph, and its prefill; the report divides det-infer by it
#   accuracy        50   20  benchmarks/contract_accuracy.py --device cuda, 10M inputs (2M took 5 s
#                            here)
#   ncu            200   95  where ncu exists: the CUDA variant rebuilt with -lineinfo (its own
#                            folder), one decode step of each shape under Nsight Compute with
#                            source-level stall sampling, boiled down by benchmarks/ncu_summary.py
#                            (the 25 lines with most samples, DRAM/issue/occupancy figures), then
#                            SmolLM2's 512-token prefill with attn 32 and tile_rows 64 (each
#                            profile at most 50 s, the rebuild ~40 s); absent or failing, it says
#                            so and passes. Last: it gets what the deadline leaves
#   total          480  ~415 7 min expected, 8 min at most (the deadline trims the last stages).
#                            With the machine's start (~30 s) a first run takes ~8 of the 15
#                            minutes, leaving room for a second.
#
# If the smoke launch hangs or crashes, geometry and bench are skipped and the digests keep only
# the tests that do not launch the megakernel; if it runs but its bits differ, everything still
# runs (the digests say where). A failed preflight or build stops the run.
#
# Writes to the folder given with --out (default: $OUT, else /tmp/device_check), at most 8 files:
#   $OUT/summary.md  one `| date | card | ... |` row for docs/RESULTS.md §9
#   $OUT/report.md   the summary, each stage's status and time, versions, binary, geometry,
#                    clocks, the digest, benchmark and accuracy tables
#   report.json   the same, for programs
#   stages.log    every stage's output     build.log   the compilers' output
#   resusage.txt  cuobjdump -res-usage      clocks.csv  nvidia-smi every 500 ms during the bench
# The report is rewritten after every stage, so a run cut short still says how far it got.
# Exit status: 0 when every stage passed, 1 otherwise.
#
#   here:   bash scripts/fetch_device_wheels.sh          (once: kernels and its closure into .whl/)
#   device: run(command="bash scripts/device_check.sh", carry=[".whl"], timeout_s=540)
#   here:   bash scripts/device_check.sh --dry-run [--out DIR]   (no GPU: the emulated executor,
#           tiny models, the same stages, timeouts and report; tests/test_device_check.py runs it)
# Knobs: DET_CUDA_ARCHS, DET_CHECK_DEADLINE, DET_CHECK_BUDGET_<STAGE> (seconds), DET_CHECK_WHEELS=all
# (install every carried wheel), DET_CHECK_ACCURACY_N, DET_CHECK_MIN_FREE_GIB, DET_CHECK_COMMIT (the
# commit, for the report, where the copy has no .git), PYTHON.
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
SELF="$ROOT/scripts/device_check.sh"
STAGE_ORDER=(preflight build smoke geometry digests bench profile peers accuracy ncu)
declare -A BUDGET=([preflight]=30 [build]=180 [smoke]=60 [geometry]=20 [digests]=90 [bench]=50 [profile]=210
                   [peers]=60 [accuracy]=50 [ncu]=200)
RESERVE=10   # seconds kept back from the deadline for the last report

# ---- the stages (each runs in its own process, under `timeout`) ---------------------------------
stage_preflight() {
  if compgen -G ".whl/*.whl" >/dev/null; then
    $PY scripts/device_check.py install-wheels --target "$SITE" ${DET_CHECK_WHEELS:+--all} || return 1
  elif [ "$DRY" = 0 ]; then
    echo "preflight: no .whl/ here (bash scripts/fetch_device_wheels.sh, carry .whl): kernels must be installed"
  fi
  $PY scripts/device_check.py preflight
}

stage_build() {
  local t=$SECONDS cpu cuda=0 rc_cpu rc_cuda=0
  echo "build: archs for the cuda variant: $($PY scripts/build_local.py --print-archs)"
  : >"$OUT_DIR/build.log"
  ($PY scripts/build_local.py --backend cpu 2>&1 | sed -u 's/^/[cpu] /' >>"$OUT_DIR/build.log") &
  cpu=$!
  if [ "$DRY" = 0 ]; then
    ($PY scripts/build_local.py --backend cuda 2>&1 | sed -u 's/^/[cuda] /' >>"$OUT_DIR/build.log") &
    cuda=$!
  else
    echo "build: dry run: the CPU variant only (torch here has no CUDA)"
    echo "dry run: no CUDA variant, no cuobjdump -res-usage" >"$OUT_DIR/resusage.txt"
  fi
  wait $cpu; rc_cpu=$?
  [ "$cuda" = 0 ] || { wait $cuda; rc_cuda=$?; }
  echo "build: cpu rc=$rc_cpu, cuda $([ "$DRY" = 1 ] && echo 'not built' || echo "rc=$rc_cuda")," \
    "$((SECONDS - t)) s (the compilers' output: build.log)"
  if [ $rc_cpu != 0 ] || [ $rc_cuda != 0 ]; then
    tail -n 25 "$OUT_DIR/build.log"
    return 1
  fi
  $PY scripts/device_check.py binary --raw "$OUT_DIR/resusage.txt"
}

stage_smoke() {
  $PY scripts/device_check.py smoke
}

stage_geometry() {
  $PY scripts/device_check.py geometry
}

stage_digests() {
  local tests=(tests/test_cuda_device.py) filter=() opts=(-v) rc=0
  [ "$DRY" = 1 ] || tests+=(tests/test_contract_math.py tests/test_rope.py
                            "tests/test_build_invariance.py::test_kernel_ops_digest")
  # -v names each test as it starts, so a hang shows which; pytest-timeout, where installed (the
  # device's image has it; it loads itself: `-p pytest_timeout` would register it twice and stop
  # pytest), then dumps the stacks and ends the run instead of letting one hang eat the stage.
  if $PY -m pytest -p no:cacheprovider --help 2>/dev/null | grep -q -- "--timeout="; then
    opts+=(--timeout=60 --timeout-method=thread)
  fi
  (
    if [ -e "$STATE/smoke_did_not_run" ]; then
      echo "digests: the smoke launch did not run: only the tests that do not launch the megakernel"
      filter=(-k "not megakernel")
    else
      $PY scripts/device_check.py digests || rc=1
    fi
    $PY -m pytest "${opts[@]}" -p no:cacheprovider -rfE --durations=5 --junitxml="$STATE/digests.xml" \
      "${tests[@]}" "${filter[@]}" || rc=1
    exit $rc
  ) 2>&1 | tee "$STATE/digests.txt"
  return "${PIPESTATUS[0]}"
}

stage_bench() {
  local args=(--steps 128 --reps 3) smi=0
  [ "$DRY" = 0 ] || args=(--executor emulated --models synthetic-llama --steps 2 --reps 1 --batches 1,4
                          --prompt-len 4 --copy-mib 64)
  if [ "$DRY" = 0 ] && command -v nvidia-smi >/dev/null; then
    nvidia-smi --query-gpu=clocks.sm,clocks.mem,power.draw,temperature.gpu --format=csv,noheader,nounits \
      -lms 500 >>"$OUT_DIR/clocks.csv" 2>/dev/null &
    smi=$!
  fi
  $PY benchmarks/bench_gpu.py "${args[@]}" | tee "$STATE/bench.txt"
  local rc=${PIPESTATUS[0]}
  [ "$smi" = 0 ] || { kill "$smi" 2>/dev/null; wait "$smi" 2>/dev/null; }
  return "$rc"
}

stage_profile() {
  local args=(--reps 3)
  [ "$DRY" = 0 ] || args=(--executor emulated --models synthetic-llama --quick --reps 1)
  $PY benchmarks/gpu_profile.py "${args[@]}" | tee "$STATE/profile.txt"
  return "${PIPESTATUS[0]}"
}

stage_peers() {
  local args=(--steps 128 --reps 3)
  [ "$DRY" = 0 ] || args=(--models tiny --device cpu --steps 4 --reps 1 --long-prompt 40)
  $PY benchmarks/peer_torch.py "${args[@]}" | tee "$STATE/peers.txt"
  return "${PIPESTATUS[0]}"
}

# One Nsight Compute profile into ncu.txt: ncu_profile NAME TITLE SKIP SECTIONS ARGS...: the launch
# after SKIP det_mk launches of `gpu_profile.py ARGS` (the -lineinfo build), with the common sections
# and SECTIONS (space-separated, may be empty), boiled down by ncu_summary.py under ### NAME: TITLE.
ncu_profile() {
  local name=$1 title=$2 skip=$3 extra=$4 rc section
  shift 4
  local sections=()
  for section in SpeedOfLight WarpStateStats SourceCounters $extra Occupancy LaunchStats; do
    sections+=(--section "$section")
  done
  rm -f "$STATE/$name.ncu-rep"
  LOCAL_KERNELS="phanerozoic/det-infer=$STATE/build-lineinfo" timeout -k 5 50 "$NCU" --clock-control none \
    -k regex:det_mk --launch-skip "$skip" --launch-count 1 "${sections[@]}" -o "$STATE/$name" \
    $PY benchmarks/gpu_profile.py "$@" >"$STATE/ncu_run.log" 2>&1
  rc=$?
  if [ $rc != 0 ] || [ ! -e "$STATE/$name.ncu-rep" ]; then
    tail -n 15 "$STATE/ncu_run.log"
    echo "ncu: $name: the profile failed (exit $rc): not recorded" | tee -a "$STATE/ncu.txt"
    return 0
  fi
  "$NCU" -i "$STATE/$name.ncu-rep" --page details >"$STATE/ncu_details.log" 2>&1
  "$NCU" -i "$STATE/$name.ncu-rep" --page source --csv --print-source cuda,sass >"$STATE/ncu_source.csv" 2>/dev/null
  { echo "### $name: $title"; echo
    $PY benchmarks/ncu_summary.py --source "$STATE/ncu_source.csv" --log "$STATE/ncu_details.log" --top 25 ||
      echo "ncu: $name: the summary failed"; echo; } | tee -a "$STATE/ncu.txt"
}

stage_ncu() {
  local shape
  NCU=$(command -v ncu || ls "$CUDA_HOME"/bin/ncu 2>/dev/null || true)
  if [ "$DRY" = 1 ] || [ -z "$NCU" ]; then
    echo "ncu: not run ($([ "$DRY" = 1 ] && echo 'dry run' || echo 'no ncu on PATH or in CUDA_HOME/bin'))" |
      tee "$STATE/ncu.txt"
    return 0
  fi
  echo "ncu: $("$NCU" --version | tail -n 1); the CUDA variant with -lineinfo, for this stage only"
  if ! DET_CUDA_EXTRA_FLAGS=-lineinfo $PY scripts/build_local.py --backend cuda --out "$STATE/build-lineinfo" \
    >"$STATE/ncu_build.log" 2>&1; then
    tail -n 20 "$STATE/ncu_build.log"
    echo "ncu: the -lineinfo build failed: not run" | tee "$STATE/ncu.txt"
    return 0
  fi
  : >"$STATE/ncu.txt"
  for shape in SmolLM2-135M Llama-3.2-1B; do
    ncu_profile "$shape" "one decode step (the 5th launch)" 4 "" --ncu-target --models "$shape"
  done
  # A prompt: SmolLM2's 512-token prefill with split attention and prompt tiles (its first launch),
  # where the prompt rows' attention units are most of the predicted time (gpu_model.py sizes).
  ncu_profile prefill "SmolLM2-135M's 512-token prefill, attn 32, tile_rows 64 (the first launch)" 0 \
    MemoryWorkloadAnalysis --ncu-prefill 512 --models SmolLM2-135M
  return 0
}

stage_accuracy() {
  local n=${DET_CHECK_ACCURACY_N:-10000000} device=cuda
  [ "$DRY" = 0 ] || { n=${DET_CHECK_ACCURACY_N:-20000}; device=cpu; }
  $PY benchmarks/contract_accuracy.py --n "$n" --device "$device" | tee "$STATE/accuracy.txt"
  return "${PIPESTATUS[0]}"
}

# ---- the runner -------------------------------------------------------------------------------------
record() {  # stage status rc seconds budget note
  printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$@" >>"$STATE/stages.tsv"
  $PY scripts/device_check.py report --out "$OUT_DIR" || echo "device_check: the report failed" >&2
}

run_stage() {
  local name=$1 var="DET_CHECK_BUDGET_${1^^}"
  local budget=${!var:-${BUDGET[$name]}} left=$((DEADLINE - SECONDS - RESERVE))
  if ((left < 3)); then
    echo "== $name: skipped, no time left before the ${DEADLINE} s deadline" | tee -a "$LOG"
    record "$name" skipped "" 0 "$budget" "no time left before the deadline"
    return 1
  fi
  ((left < budget)) && budget=$left
  printf '\n== %s (timeout %s s, %s s into the run)\n' "$name" "$budget" "$SECONDS" | tee -a "$LOG"
  local t0=${EPOCHREALTIME/,/.}
  timeout -k 5 "$budget" bash "$SELF" --stage "$name" 2>&1 | tee -a "$LOG"
  local rc=${PIPESTATUS[0]} status=pass note=""
  local secs
  secs=$(awk -v a="$t0" -v b="${EPOCHREALTIME/,/.}" 'BEGIN { printf "%.1f", b - a }')
  case $rc in
    0) ;;
    124 | 137) status=timeout note="stopped after $budget s" ;;
    3) status=fail note="ran, but the bits differ from the CPU engine's" ;;
    *) status=fail note="exit status $rc" ;;
  esac
  [ "$name" = smoke ] && [ "$status" != pass ] && [ $rc != 3 ] && : >"$STATE/smoke_did_not_run"
  echo "== $name: $status in $secs s${note:+ ($note)}" | tee -a "$LOG"
  record "$name" "$status" "$rc" "$secs" "$budget" "$note"
  [ "$status" = pass ]
}

skip() {  # stage reason
  echo "== $1: skipped ($2)" | tee -a "$LOG"
  record "$1" skipped "" 0 "" "$2"
}

main() {
  mkdir -p "$OUT_DIR" "$STATE" && : >"$STATE/stages.tsv" && : >"$LOG" || exit 1
  printf '# clocks.sm MHz, clocks.mem MHz, power.draw W, temperature.gpu C; every 500 ms during the bench%s\n' \
    "$([ "$DRY" = 1 ] && echo ' (dry run: no GPU, no samples)')" >"$OUT_DIR/clocks.csv"
  echo "device_check: $([ "$DRY" = 1 ] && echo 'DRY RUN (emulated executor, tiny models), ')report in $OUT_DIR," \
    "deadline ${DEADLINE} s" | tee -a "$LOG"
  local rest
  if ! run_stage preflight; then
    for rest in "${STAGE_ORDER[@]:1}"; do skip "$rest" "preflight failed"; done
    finish
  fi
  # The build, and the tests' own build calls (tests/conftest.py), for this GPU's architecture only.
  [ "$DRY" = 1 ] || export DET_CUDA_ARCHS="${DET_CUDA_ARCHS:-$(cat "$STATE/archs")}"
  if ! run_stage build; then
    for rest in "${STAGE_ORDER[@]:2}"; do skip "$rest" "build failed"; done
    finish
  fi
  run_stage smoke
  local launches=1
  [ -e "$STATE/smoke_did_not_run" ] && launches=0
  if ((launches)); then run_stage geometry; else skip geometry "the smoke launch did not run"; fi
  run_stage digests
  if ((launches)); then run_stage bench; else skip bench "the smoke launch did not run"; fi
  $PY scripts/device_check.py clocks "$OUT_DIR/clocks.csv"
  if ((launches)); then run_stage profile; else skip profile "the smoke launch did not run"; fi
  run_stage peers
  run_stage accuracy
  if ((launches)); then run_stage ncu; else skip ncu "the smoke launch did not run"; fi
  finish
}

finish() {
  $PY scripts/device_check.py report --out "$OUT_DIR" >/dev/null 2>&1
  echo
  cat "$OUT_DIR/summary.md"
  local failed
  failed=$(awk -F'\t' '$2 != "pass" { printf "%s%s(%s)", sep, $1, $2; sep = ", " }' "$STATE/stages.tsv")
  echo "device_check: ${failed:-every stage passed}; ${SECONDS} s in all; report in $OUT_DIR"
  rm -rf "$STATE"
  [ -z "$failed" ]
  exit $?
}

# ---- arguments and environment (shared with the stage processes) ----------------------------------
DRY=${DET_CHECK_DRY:-0} OUT_DIR=${DET_CHECK_OUT:-} STAGE=""
while [ $# -gt 0 ]; do
  case $1 in
    --dry-run) DRY=1 ;;
    --out) OUT_DIR=$2; shift ;;
    --stage) STAGE=$2; shift ;;  # internal: run one stage in this process (the runner does this)
    -h | --help) sed -n '2,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "device_check: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
  shift
done
if [ -n "$STAGE" ]; then
  "stage_$STAGE"
  exit $?
fi
OUT_DIR=$(mkdir -p "${OUT_DIR:-${OUT:-/tmp/device_check}}" && cd "${OUT_DIR:-${OUT:-/tmp/device_check}}" && pwd)
STATE=$(mktemp -d "${TMPDIR:-/tmp}/device_check_state.XXXXXX")
LOG="$OUT_DIR/stages.log"
DEADLINE=${DET_CHECK_DEADLINE:-480}
if [ "$DRY" = 1 ]; then
  PY=${PYTHON:-$([ -x .venv/bin/python ] && echo "$ROOT/.venv/bin/python" || echo python3)}
  SITE="$STATE/site"
else
  PY=${PYTHON:-python3}
  SITE=/tmp/site
fi
export DET_CHECK_DRY=$DRY DET_CHECK_STATE=$STATE DET_CHECK_OUT=$OUT_DIR PY SITE STATE OUT_DIR LOG
# $ROOT: det_fixtures (the shared models and pins) for the Python stages.
export PYTHONPATH="$SITE:$ROOT${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 PIP_ROOT_USER_ACTION=ignore
export CUDA_HOME=${CUDA_HOME:-/usr/local/cuda} LOCAL_KERNELS="phanerozoic/det-infer=$ROOT/build"
main
