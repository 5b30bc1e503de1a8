"""scripts/device_check.sh, the one-shot GPU check, proven here without a GPU: its --dry-run runs the
same stages, timeouts and report on the emulated executor with tiny models, and must pass; a stage
that runs out of time, and a failed preflight, must be reported and give a non-zero exit. The pieces
the dry run cannot reach (cuobjdump's output, the wheel resolver against other installs, the
nvcc/torch CUDA check) are tested on canned inputs. About 40 s on 2 cores, most of it the dry run."""
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "device_check.sh"
sys.path.insert(0, str(ROOT / "scripts"))
import build_local  # noqa: E402
import device_check as dc  # noqa: E402

REPORT_FILES = {dc.SUMMARY_FILE, dc.REPORT_FILE, "report.json", "stages.log", "build.log", "resusage.txt", "clocks.csv"}


def run_check(out, **env):
    """The dry run into out; (completed process, report.json)."""
    full = dict(os.environ, PYTHON=sys.executable, DET_CUDA_ARCHS="9.0", **env)
    full.pop("OUT", None)
    r = subprocess.run(["bash", str(SCRIPT), "--dry-run", "--out", str(out)], env=full, capture_output=True,
                       text=True, timeout=600)
    report = json.loads((out / "report.json").read_text()) if (out / "report.json").exists() else None
    return r, report


def statuses(report):
    return {s["stage"]: s["status"] for s in report["stages"]}


@pytest.fixture(scope="module")
def dry_run(di, tmp_path_factory):
    """The whole dry run (di: the CPU variant is built first, so the build stage finds it up to date)."""
    out = tmp_path_factory.mktemp("device_check")
    r, report = run_check(out)
    return r, report, out


def test_dry_run_passes_every_stage(dry_run):
    r, report, _ = dry_run
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]
    assert list(statuses(report)) == list(dc.STAGES)
    assert set(statuses(report).values()) == {"pass"}, report["stages"]
    assert "every stage passed" in r.stdout


def test_dry_run_report_files(dry_run):
    """The files the device tool brings back: at most 8, plain names, each saying what it should."""
    _, report, out = dry_run
    files = {p.name for p in out.iterdir()}
    assert files == REPORT_FILES and len(files) <= 8
    assert all(re.fullmatch(r"[A-Za-z0-9._-]+", f) for f in files)
    pre = report["preflight"]
    for key in ("python", "torch", "torch_cuda", "kernels", "huggingface_hub", "nvcc", "free_gib", "card"):
        assert pre.get(key), key
    assert pre["archs"] == "9.0"  # DET_CUDA_ARCHS is honoured
    assert report["geometry"]["grid"] == 4 and report["geometry"]["bounded"]
    assert [(m["model"], m["teacher_forced"], m["generation"]) for m in report["digests"]["models"]] == \
        [("llama", True, True)]
    assert report["smoke"]["ok"] and [g["label"] for g in report["smoke"]["launches"]] == ["grid 2", "default geometry"]
    assert report["tests"]["skipped"] >= 1 and report["tests"]["failures"] == 0
    log = (out / "stages.log").read_text()
    for name in dc.STAGES:
        assert f"== {name}: pass in" in log
    assert "build: archs for the cuda variant: 9.0" in log
    md = (out / dc.REPORT_FILE).read_text()
    assert "DRY RUN" in md and "| smoke | pass |" in md and "## Decode benchmark" in md
    assert "synthetic-llama" in md and "max error (ulp)" in md
    # the new stages: the profile (its tables and the phase timeline), the peers, ncu (not run here)
    assert "## Profile" in md and "| per step, 1 layers, batch 1, ms |" in md and "| qkv |" in md
    assert "| per step, batch 16, ahead 16, ms |" in md  # geometry ahead beside 0 (issue 50)
    assert "| per step, batch 1, barrier 1, ms |" in md  # the monotonic barrier (issue 50)
    assert "| per step, batch 16, outs 4, ms |" in md and "attn 32, outs 4, tok/s |" in md  # issue 49
    assert "| per step, batch 1, stage 1, ms |" in md  # inputs staged in shared memory (issue 49)
    assert "attn 32, tile_rows 64, tok/s |" in md  # prompt tiles (issue 49)
    assert "| per step, batch 8, all switches, ms |" in md and "attn 32, all switches, tok/s |" in md  # sizes
    assert "Phase timeline" in md and "## Peers" in md and "| tiny | 1 |" in md
    # score_batch beside the CPU engine (issue 49's 10x goal), its ratio a number
    assert "emulated, all switches, continuation tok/s |" in md and "CPU engine (" in md
    assert re.search(r"\| score_batch, 4 pairs of 12 \+ 4 tokens, emulated / CPU engine \| [\d.e+-]+x \|", md)
    assert re.search(r"\| per step, batch 1, sampled, temperature 1, ms \| [\d.]+ \|", md)  # beside greedy
    assert "| a block's inputs staged, us | its fastest warp done, us |" in md  # a phase's anatomy (issue 50)
    assert "## Nsight Compute" in md and "ncu: not run (dry run)" in md


def test_dry_run_summary_table(dry_run):
    """The summary file is one `| date | card | ... |` row, ready for docs/RESULTS.md §9."""
    _, report, out = dry_run
    lines = (out / dc.SUMMARY_FILE).read_text().splitlines()
    assert len(lines) == 3 and lines[0].startswith("| date | card |") and set(lines[1]) <= set("|-")
    head, row = ([c.strip() for c in ln.strip("|").split("|")] for ln in (lines[0], lines[2]))
    assert len(head) == len(row) == lines[1].count("---")
    cell = dict(zip(head, row))
    assert re.fullmatch(r"\d{4}-\d\d-\d\d", cell["date"]) and "dry run" in cell["card"]
    assert cell["stages"] == f"{len(dc.STAGES)}/{len(dc.STAGES)} pass" and cell["smoke"] == "pass"
    assert "pins 2/2" in cell["digests"] and re.search(r"synthetic-llama \d+/\d+", cell["decode tok/s b1/b16"])
    assert float(cell["contract max ulp"]) <= 1.0 and "9.0" in cell["archs"]
    assert lines[0] in (out / dc.REPORT_FILE).read_text()


def test_stage_timeout_is_reported_and_fails(di, tmp_path):
    """A smoke stage that runs out of time: reported as a timeout, the megakernel stages skipped, the
    others still run, exit status 1."""
    r, report = run_check(tmp_path, DET_CHECK_BUDGET_SMOKE="1")
    assert r.returncode == 1, r.stdout[-3000:]
    st = statuses(report)
    assert st["smoke"] == "timeout" and st["geometry"] == st["bench"] == st["profile"] == st["ncu"] == "skipped"
    assert st["preflight"] == st["build"] == st["accuracy"] == st["peers"] == "pass"
    assert "only the tests that do not launch the megakernel" in r.stdout
    row = report["summary"]
    assert row["smoke"] == "timeout" and row["stages"] == f"5/{len(dc.STAGES)} pass"
    assert "smoke(timeout)" in r.stdout


def test_failed_preflight_stops_the_run(tmp_path):
    r, report = run_check(tmp_path, DET_CHECK_MIN_FREE_GIB="1000000")
    assert r.returncode == 1
    assert "preflight: FAILED: only" in r.stdout and "GiB free" in r.stdout
    st = statuses(report)
    assert st["preflight"] == "fail" and all(st[s] == "skipped" for s in dc.STAGES[1:])
    assert (tmp_path / dc.SUMMARY_FILE).read_text().startswith("| date | card |")


# ---- the pieces the dry run cannot reach -------------------------------------------------------
RES_USAGE = """
Fatbin elf code:
================
arch = sm_90
code version = [1,8]
host = linux
compile_size = 64bit

Resource usage:
 Common:
  GLOBAL:0
 Function _Z13det_mk_kernel13det_mk_params:
  REG:249 STACK:688 SHARED:1024 LOCAL:0 CONSTANT[0]:1048 TEXTURE:0 SURFACE:0 SAMPLER:0
 Function _Z10unary_kernPfPKfi:
  REG:32 STACK:0 SHARED:0 LOCAL:0 CONSTANT[0]:380 TEXTURE:0 SURFACE:0 SAMPLER:0
"""


def test_res_usage_parse():
    usage = dc.parse_res_usage(RES_USAGE)
    assert usage["sm_90"]["_Z13det_mk_kernel13det_mk_params"] == {"reg": 249, "stack": 688, "shared": 1024, "local": 0}
    assert usage["sm_90"]["_Z10unary_kernPfPKfi"]["reg"] == 32


def _wheel(version, *requires):
    return {"file": f"x-{version}.whl", "version": version, "requires": list(requires)}


def test_wheel_resolution_against_what_is_installed():
    wheels = {"kernels": _wheel("0.17.2", "huggingface-hub>=1.10.0", "pyyaml>=6", "sigstore<5,>=4",
                                "tomli>=2.0; python_full_version < '3.11'", "matplotlib; extra == 'benchmark'"),
              "huggingface-hub": _wheel("2.4.0", "httpx2<3,>=2"), "httpx2": _wheel("2.16.2"),
              "pyyaml": _wheel("6.0.4"), "sigstore": _wheel("4.5.1", "pydantic[email]>=2"),
              "pydantic": _wheel("2.14.4", "email-validator>=2; extra == 'email'"), "email-validator": _wheel("2.4.0")}
    # the device's huggingface_hub 1.33 satisfies kernels: kept, and its needs not followed
    installed = {"huggingface-hub": {"version": "1.33.0", "requires": []}, "pyyaml": {"version": "5.4", "requires": []}}
    names, kept = dc.resolve("kernels==0.17.2", wheels, installed, environment=dc.DEVICE_PYTHON)
    assert names == ["email-validator", "kernels", "pydantic", "pyyaml", "sigstore"]  # pyyaml 5.4 is too old
    assert kept == {"huggingface-hub": ("1.33.0", ">=1.10.0")}
    assert dc.resolve("kernels==0.17.2", wheels, installed, prefer_wheels=True)[0] == sorted(wheels)
    with pytest.raises(ValueError, match="sigstore"):
        dc.resolve("kernels==0.17.2", {k: v for k, v in wheels.items() if k != "sigstore"}, installed)
    with pytest.raises(ValueError, match=r"huggingface-hub: the wheel is 0\.9"):
        dc.resolve("kernels==0.17.2", dict(wheels, **{"huggingface-hub": _wheel("0.9")}), {})


def test_fetched_wheels_are_a_pinned_closure():
    """scripts/fetch_device_wheels.sh's output, where it has been run here."""
    if not list((ROOT / ".whl").glob("*.whl")):
        pytest.skip("no .whl/ here (bash scripts/fetch_device_wheels.sh)")
    r = subprocess.run([sys.executable, str(ROOT / "scripts" / "device_check.py"), "check-wheels"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr


def test_cuda_archs_override_and_major_check(monkeypatch):
    toml = ["7.5", "8.0", "9.0", "12.0"]
    monkeypatch.delenv("DET_CUDA_ARCHS", raising=False)
    assert build_local.cuda_archs(toml) == toml
    monkeypatch.setenv("DET_CUDA_ARCHS", "9.0")
    assert build_local.cuda_archs(toml) == ["9.0"]
    monkeypatch.setenv("DET_CUDA_ARCHS", "8.0; 9.0a,8.0")
    assert build_local.cuda_archs(toml) == ["8.0", "9.0a"]
    monkeypatch.setenv("DET_CUDA_ARCHS", "sm_90")
    with pytest.raises(SystemExit, match="DET_CUDA_ARCHS"):
        build_local.cuda_archs(toml)
    assert build_local.check_cuda_majors("13.0", (13, 2)) is None
    assert "majors must match" in build_local.check_cuda_majors("12.8", (13, 0))
    assert "cannot read" in build_local.check_cuda_majors("13.0", None)


def test_report_parsers():
    bench = ("| model | weights GB | b1 tok/s | b16 tok/s | b16/b1 | decode_step ms | floor tok/s | b1 % of floor |\n"
             "|---|---|---|---|---|---|---|---|\n| SmolLM2-135M | 0.27 | 1500 | 9000 | 6.0x | 0.6 | 16000 | 9% |\n"
             "| Llama-3.2-1B | 2.47 | 400 | 3000 | 7.5x | 2.4 | 1700 | 23% |\n")
    assert dc.bench_summary(bench) == "SmolLM2-135M 1500/9000; Llama-3.2-1B 400/3000"
    acc = "| function | inputs | max error (ulp) |\n|---|---|---|\n| exp | 10 | 0.4999 |\n| sin | 10 | 0.5000001 |\n"
    assert dc.accuracy_summary(acc) == 0.5000001
    assert dc.largest_accepted(lambda n: n <= 132, 1, 65535) == 132
    assert dc.largest_accepted(lambda n: False, 1, 8) is None


def test_report_commit_prefers_the_environment(monkeypatch, tmp_path):
    """DET_CHECK_COMMIT wins; without it, a copy with no .git of its own inside another repository
    does not report that repository's commit (the 2026-12-04 H200 report named the wrong one)."""
    monkeypatch.setenv("DET_CHECK_COMMIT", "a9e47fed4a")
    assert dc.report_commit().startswith("a9e47fed4a")
    monkeypatch.delenv("DET_CHECK_COMMIT")
    assert re.match(r"[0-9a-f]{10}", dc.report_commit())  # this checkout: its own HEAD
    outer = tmp_path / "outer"
    copy = outer / "det-infer"
    copy.mkdir(parents=True)
    subprocess.run(["git", "init", "-q", str(outer)], check=True)
    subprocess.run(["git", "-C", str(outer), "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q",
                    "--allow-empty", "-m", "outer"], check=True)
    monkeypatch.setattr(dc, "ROOT", copy)
    assert dc.report_commit().startswith("unknown")


def test_peer_ratios_side_by_side():
    """The report divides det-infer's figures by the peer's of the same model, batch and prompt."""
    bench = ("| model | weights GB | b1 tok/s | b16 tok/s |\n|---|---|---|---|\n"
             "| SmolLM2-135M | 0.27 | 256 | 2157 |\n| Llama-3.2-1B | 2.47 | 221 | 976 |\n")
    peers = ("PyTorch peer\n| model | batch | graph ms/step | graph tok/s | eager ms/step | prefill 16 tok/s | "
             "prefill 1000 tok/s |\n|---|---|---|---|---|---|---|\n| SmolLM2-135M | 1 | 3.556 | 281 | 20.5 | 800 | 20000 |\n"
             "| SmolLM2-135M | 16 | 3.877 | 4127 | 30.7 | 9000 | 40000 |\n")
    profile = ("### SmolLM2-135M\n\n| what | measured | predicted |\n|---|---|---|\n"
               "| prefill, 1000-token prompt, tok/s | 1,000 | 965 |\n")
    rows = dc.peer_ratios(bench, profile, peers)
    got = {(r["what"], r["ratio"]) for r in rows}
    assert got == {("decode tok/s, batch 1", round(256 / 281, 3)), ("decode tok/s, batch 16", round(2157 / 4127, 3)),
                   ("prefill tok/s, 1000-token prompt", 0.05)}
    assert "0.91x" in dc.ratio_table(rows)
    assert dc.peer_ratios(bench, "", "") == [] and "no model" in dc.ratio_table([])


def test_ncu_prefill_target_runs_one_prefill(di):
    """The ncu stage's prompt profile (gpu_profile.py --ncu-prefill), which the dry run skips with
    the rest of ncu: under emulation it makes its model with split attention and prompt tiles and
    runs the prefill."""
    env = dict(os.environ, LOCAL_KERNELS=f"phanerozoic/det-infer={ROOT / 'build'}")
    r = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu_profile.py"), "--executor", "emulated",
                        "--models", "synthetic-llama", "--ncu-prefill", "40"], capture_output=True, text=True,
                       env=env, timeout=300)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert "ncu target: one prefill of 40 tokens, geometry {'attn': 32, 'tile_rows': 64}, done" in r.stdout
