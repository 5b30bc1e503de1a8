"""The megakernel's launch geometry: its fields, their defaults and what each accepts. Scheduling
only, never a bit of the result (docs/SPEC.md §14.3); the launcher's own checks are
det_mk_check_geometry (megakernel/det_megakernel_plan.cpp)."""

# Rows per tile (DET_MK_TILE_MAX = 128); the GPU planner picks at most 16 by itself.
TILE_ROWS = (1, 2, 4, 8, 16, 32, 64, 128)
GEOMETRY_FIELDS = ("grid", "warps", "ring", "tile_rows", "seed", "attn", "ahead", "barrier", "outs", "stage",
                   "area_rows")
DEFAULT_GEOMETRY = {"emulated": {"grid": 2, "warps": 2, "ring": 2, "tile_rows": 16, "seed": 0, "attn": 0,
                                 "ahead": 0, "barrier": 0, "outs": 0, "stage": 0, "area_rows": 0},
                    "megakernel": {"grid": 0, "warps": 0, "ring": 0, "tile_rows": 0, "seed": 0, "attn": 0,
                                   "ahead": 0, "barrier": 0, "outs": 0, "stage": 0, "area_rows": 0}}
# 0: auto (attn, ahead, barrier, outs, stage: the first design; area_rows: the whole tile, or on a GPU
# the most of its rows that fit a block's shared memory)
AHEAD_MAX_KB = 256  # DET_MK_AHEAD_MAX_KB
STAGE_HEAD_DIM_MAX = 128  # DET_MK_STAGE_HEAD_DIM_MAX: geometry stage 2 copies chunks of at most this head size
VALUE_MAX = 2**31 - 1  # the launcher's fields are C ints


def geometry_from_text(text):
    """{field: int} from the text form "tile_rows=64;attn=32": fields separated by ";" or ",",
    each name=value (or name:value), spaces around them ignored. For command lines, and for
    lm-eval's model_args, whose own parser splits on commas: use ";" there."""
    fields = {}
    for item in text.replace(",", ";").split(";"):
        if not item.strip():
            continue
        name, sep, value = (part.strip() for part in item.replace(":", "=", 1).partition("="))
        if not sep or not name or not (value.isascii() and value.isdigit()) or int(value) > VALUE_MAX:
            raise ValueError(f"det-infer: geometry {text!r}: {item.strip()!r} is not name=value with an int value "
                             f"in 0..{VALUE_MAX}; write it as \"tile_rows=64;attn=32\" "
                             f"(fields: {', '.join(GEOMETRY_FIELDS)})")
        if name in fields:
            raise ValueError(f"det-infer: geometry {text!r} sets {name} twice")
        fields[name] = int(value)
    return fields


def resolve_geometry(executor, geometry):
    """The whole geometry for executor ('engine': None) from the fields given: a dict, or the text
    form (geometry_from_text); every field checked against what the launcher accepts."""
    if isinstance(geometry, str):
        geometry = geometry_from_text(geometry)
    if geometry is not None and not isinstance(geometry, dict):
        raise ValueError(f"det-infer: geometry must be a dict of fields or their text form (\"tile_rows=64;attn=32\"), "
                         f"got {type(geometry).__name__}")
    if executor == "engine":
        if geometry:
            raise ValueError("det-infer: geometry= applies to the megakernel executors ('megakernel', 'emulated')")
        return None
    g = dict(DEFAULT_GEOMETRY[executor])
    for key, value in (geometry or {}).items():
        if key not in GEOMETRY_FIELDS:
            raise ValueError(f"det-infer: unknown geometry field {key!r}; fields: {', '.join(GEOMETRY_FIELDS)}")
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= VALUE_MAX:
            raise ValueError(f"det-infer: geometry {key} must be an int in 0..{VALUE_MAX}, got {value!r}")
        g[key] = value
    if not 0 <= g["attn"] <= 32:
        raise ValueError(f"det-infer: geometry attn must be 0 (a warp per query head walks the context) or 1..32 "
                         f"(chunk units over the grid, each row's last folding; that many 128-position chunks "
                         f"per pass), "
                         f"got {g['attn']!r}")
    if g["ahead"] > AHEAD_MAX_KB:
        raise ValueError(f"det-infer: geometry ahead must be 0 (a phase loads its weights when it starts) or "
                         f"1..{AHEAD_MAX_KB} (each warp requests its next phase's first ring stages, and that many KB "
                         f"of its weight rows into L2, before the barrier), got {g['ahead']!r}")
    if g["barrier"] not in (0, 1):
        raise ValueError(f"det-infer: geometry barrier must be 0 (the generation barrier) or 1 (a monotonic arrival "
                         f"counter: one atomic a block), got {g['barrier']!r}")
    if g["outs"] not in (0, 1, 2, 4):
        raise ValueError(f"det-infer: geometry outs must be 0 or 1 (a warp streams one weight row at a time), 2 or 4 "
                         f"(that many rows at once, each input value loaded feeding all of them), got {g['outs']!r}")
    if g["stage"] not in (0, 1, 2, 3):
        raise ValueError(f"det-infer: geometry stage must be 0 (nothing copied), 1 (each block copies the output "
                         f"projections' and Gemma-4's per-layer gate's input rows into its shared memory once, when "
                         f"they fit), 2 (with attn > 0, each block copies a chunk's keys and values once for the "
                         f"rows of one sequence it takes: prompt tiles, head_dim <= {STAGE_HEAD_DIM_MAX}) or 3 "
                         f"(both), got {g['stage']!r}")
    if g["area_rows"] not in (0, *TILE_ROWS):
        raise ValueError(f"det-infer: geometry area_rows must be 0 (the whole tile; on a GPU, the most of its rows "
                         f"that fit a block's shared memory) or one of {', '.join(map(str, TILE_ROWS))} (the rows of "
                         f"a tile that the normalizing phases hold in shared memory at once), got {g['area_rows']!r}")
    if executor == "emulated" and not (g["grid"] >= 1 and 1 <= g["warps"] <= 32 and g["ring"] in (2, 4)
                                       and g["tile_rows"] in TILE_ROWS):
        raise ValueError(f"det-infer: emulated geometry {g} is out of range: grid >= 1, warps 1..32, ring 2 or 4, "
                         "tile_rows 1, 2, 4, 8, 16, 32, 64 or 128")
    return g
