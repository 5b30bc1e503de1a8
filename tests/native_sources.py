"""The native source lists tests and tools compile on their own (without torch), read from the one
list in build.toml, [kernel.det_infer_cpu].src, so a new or moved file needs no edit here."""
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CPU_SOURCES = tomllib.loads((ROOT / "build.toml").read_text())["kernel"]["det_infer_cpu"]["src"]


def _compiled_in(folder):
    """The .cpp files directly in folder (a path relative to the repository root)."""
    return [s for s in CPU_SOURCES if s.endswith(".cpp") and str(Path(s).parent) == folder]


ENGINE = _compiled_in("det_infer_cpu")  # the torch-free engine core
X86 = _compiled_in("det_infer_cpu/x86")  # its x86 SIMD kernels
EMULATION = _compiled_in("megakernel/host") + _compiled_in("megakernel")  # the megakernel under host emulation
