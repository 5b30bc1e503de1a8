"""Where a megakernel launch spends its time: the per-phase timeline (internal, for the benchmarks
and the device check; not part of the v1 surface).

With the timeline on, every block stamps a clock (%globaltimer on the GPU, a steady clock under
emulation) when it reaches each grid synchronization (every warp of the block has finished the
phase) and when it leaves it, when its phase area first holds the phase's inputs (the normalized or
staged rows), and each of its warps when that warp reaches the synchronization. From those stamps,
per synchronization j:
  phase     the slowest block's arrival at j minus the last departure from j - 1: how long the
            phase took the grid (its critical path)
  spread    the slowest block's arrival minus the fastest's: how long the fastest block waited for
            the slowest (stall sampling cannot see it: idle warps dominate its samples)
  release   the first departure from j minus the slowest arrival: the barrier's own cost
and, per block from its own departure from j - 1, the median over blocks of:
  ready       until its inputs were staged (None for a phase that stages none)
  first_warp  until its fastest warp was done
  last_warp   until its slowest warp was done (just before the block's arrival)
so that a phase's time splits into staging, the warps' own work and the wait for the grid.
Stamps never touch the arithmetic: a profiled generation is the same bits as a plain one (tested).

Under emulation, work_profile also counts what each warp does in each phase (the SIMT layer counts
every load of det_ld / det_load_f32x4 / cp.async, global or shared by address, and the fmas the
kernel reports with det_work_fma), so an imbalance shows without a GPU: work_table gives, per
kind of phase, the busy warps and the busiest warp against the mean of the busy ones.
"""
import statistics

import torch

from ._ops import ops

WARPS_AUTO_MAX = 8  # the launcher's warps a block when the geometry leaves it at 0 (det_mk_cuda_resolve)


def phase_timeline(mm, prompts, max_new, capacity=1024, work=None):
    """Runs generate_batch(prompts, max_new) (greedy) through the megakernel or its emulation with
    the timeline on, for the first `capacity` synchronizations. Returns dict(tokens, grid, warps,
    tags (list of int), arrive, leave and ready (int64 (n, grid) ns tensors on the CPU; ready 0 where
    the block staged no input) and warp_done (int64 (n, grid, warps)))."""
    if mm.executor == "engine":
        raise ValueError("det-infer: the phase timeline is the megakernel's (executor 'megakernel' or 'emulated'), "
                         "not the CPU engine's")
    if not isinstance(capacity, int) or capacity < 1:
        raise ValueError(f"det-infer: capacity must be a positive int, got {capacity!r}")
    prompts, args, _, _ = mm._generate_args(prompts, max_new, False, None, False, 0.0, 0, 1.0, 0.0, 0)
    geometry = mm._geometry_list()
    grid_max, warps_max = geometry[0], geometry[1] or WARPS_AUTO_MAX
    if grid_max == 0:  # the launcher picks the grid: room for every block of this size the device holds
        props = torch.cuda.get_device_properties(mm.device)
        grid_max = props.multi_processor_count * (props.max_threads_per_multi_processor // (32 * warps_max))
    # Slots per (synchronization, block): arrival, departure, inputs ready, then each warp's arrival
    # (det_mk_stamp_slots, megakernel/det_megakernel.h).
    stamps = torch.zeros(capacity * grid_max * (3 + warps_max), dtype=torch.int64, device=mm.device)
    tags = torch.full((capacity,), -2, dtype=torch.int32, device=mm.device)
    empty = torch.empty(0, dtype=torch.int64)
    grid, warps = ops._test_mega_timeline(*args, geometry, stamps, tags, work if work is not None else empty)
    out, lengths = args[-3].cpu(), args[-2].cpu()
    tags = tags.cpu()
    n = int((tags != -2).sum())
    st = stamps[: n * grid * (3 + warps)].cpu().view(n, grid, 3 + warps)
    return dict(tokens=[out[b, : lengths[b]].tolist() for b in range(len(prompts))], grid=grid, warps=warps,
                tags=tags[:n].tolist(), arrive=st[:, :, 0], leave=st[:, :, 1], ready=st[:, :, 2],
                warp_done=st[:, :, 3:])


def _block_median_us(stamps, start):
    """The median over blocks of stamps - start (ns tensors over blocks), in us."""
    return statistics.median((stamps - start).tolist()) / 1e3


def phases(timeline, plan):
    """One dict per synchronization: kind (the plan step's; "out_norm" for a residual's second
    phase, "attend_pass" for split attention's passes but the last (units and folds), "pick"
    for the end of a decode step), layer, phase / spread / release in us, and from j = 1 on the
    per-block medians ready / first_warp / last_warp in us (None at j = 0, whose blocks' start is
    not stamped; ready None where no block staged inputs)."""
    arrive, leave, ready, done = timeline["arrive"], timeline["leave"], timeline["ready"], timeline["warp_done"]
    rows = []
    for j, tag in enumerate(timeline["tags"]):
        if tag == -1:
            kind, layer = "pick", -1
        else:
            step = plan[tag // 2]
            inner = {"residual": "out_norm", "attend": "attend_pass"}  # the steps with inner barriers
            kind, layer = (inner[step["kind"]] if tag % 2 else step["kind"]), step["layer"]
        last_in = int(arrive[j].max())
        start = int(leave[j - 1].max()) if j else int(arrive[j].min())
        row = dict(kind=kind, layer=layer, phase_us=(last_in - start) / 1e3,
                   spread_us=(last_in - int(arrive[j].min())) / 1e3,
                   release_us=(int(leave[j].min()) - last_in) / 1e3, ready_us=None, first_warp_us=None,
                   last_warp_us=None)
        if j:
            began = leave[j - 1]  # each block's own start of the phase
            staged = ready[j] > 0
            if staged.any():
                row["ready_us"] = _block_median_us(ready[j][staged], began[staged])
            row["first_warp_us"] = _block_median_us(done[j].min(dim=1).values, began)
            row["last_warp_us"] = _block_median_us(done[j].max(dim=1).values, began)
        rows.append(row)
    return rows


def phase_table(rows):
    """Markdown: per kind, the count, the medians of phase, of a block's inputs staged, fastest and
    slowest warp done (from the block's start), of spread and release (us), and the kind's share of
    the summed phase time."""
    total = sum(r["phase_us"] for r in rows) or 1.0
    kinds = list(dict.fromkeys(r["kind"] for r in rows))

    def med(sel, key):
        vals = [r[key] for r in sel if r.get(key) is not None]
        return f"{statistics.median(vals):.2f}" if vals else "-"

    out = ["| phase | count | median us | a block's inputs staged, us | its fastest warp done, us | "
           "its slowest warp done, us | fastest block waited, us | barrier release, us | share |",
           "|---|---|---|---|---|---|---|---|---|"]
    for k in kinds:
        sel = [r for r in rows if r["kind"] == k]
        out.append(f"| {k} | {len(sel)} | {med(sel, 'phase_us')} | {med(sel, 'ready_us')} | "
                   f"{med(sel, 'first_warp_us')} | {med(sel, 'last_warp_us')} | {med(sel, 'spread_us')} | "
                   f"{med(sel, 'release_us')} | {100 * sum(r['phase_us'] for r in sel) / total:.0f}% |")
    return "\n".join(out)


WORK_KINDS = ("global_bytes", "shared_bytes", "loads", "fmas")


def work_profile(mm, prompts, max_new, capacity=1024):
    """Under emulation: phase_timeline's result plus work, an int64 (n, grid * warps, 4) tensor:
    per phase (ending at synchronization j) and warp, the global bytes, shared bytes, loads and
    fmas its 32 threads did."""
    if mm.executor != "emulated":
        raise ValueError(f"det-infer: the work profile counts under emulation only (executor 'emulated'), "
                         f"not {mm.executor!r}")
    if not isinstance(capacity, int) or capacity < 1:
        raise ValueError(f"det-infer: capacity must be a positive int, got {capacity!r}")
    nwarps = mm.geometry["grid"] * mm.geometry["warps"]
    work = torch.zeros(capacity * nwarps * len(WORK_KINDS), dtype=torch.int64)
    tl = phase_timeline(mm, prompts, max_new, capacity, work=work)
    tl["work"] = work.view(capacity, nwarps, len(WORK_KINDS))[: len(tl["tags"])]
    return tl


def work_rows(profile, plan):
    """Per synchronization: kind and layer (as phases() names them), busy warps (any load or fma),
    the warps in the grid, and per work kind the busiest warp's count and the mean over busy warps."""
    rows = []
    for j, row in enumerate(phases(profile, plan)):
        w = profile["work"][j]  # (warps, kinds)
        busy = (w[:, 2] + w[:, 3]) > 0
        n_busy = int(busy.sum())
        r = dict(kind=row["kind"], layer=row["layer"], busy=n_busy, warps=w.shape[0])
        for i, k in enumerate(WORK_KINDS):
            col = w[:, i].double()
            r[k + "_max"] = float(col.max())
            r[k + "_mean"] = float(col[busy].mean()) if n_busy else 0.0
        rows.append(r)
    return rows


def work_table(rows):
    """Markdown: per kind of phase, the median over its phases of the busy warps, and of the
    busiest warp's loads, fmas and bytes against the busy warps' mean (max / mean)."""
    kinds = list(dict.fromkeys(r["kind"] for r in rows))
    out = ["| phase | busy warps | busiest warp: loads (max/mean) | fmas (max/mean) | global bytes | shared bytes |",
           "|---|---|---|---|---|---|"]

    def med(sel, key):
        return statistics.median(r[key] for r in sel)

    for k in kinds:
        sel = [r for r in rows if r["kind"] == k]
        cells = []
        for w in ("loads", "fmas"):
            mx, mean = med(sel, w + "_max"), med(sel, w + "_mean")
            cells.append(f"{mx:,.0f} ({mx / mean:.1f}x)" if mean else f"{mx:,.0f}")
        out.append(f"| {k} | {med(sel, 'busy'):.0f} of {sel[0]['warps']} | {cells[0]} | {cells[1]} | "
                   f"{med(sel, 'global_bytes_max'):,.0f} | {med(sel, 'shared_bytes_max'):,.0f} |")
    return "\n".join(out)
