"""What the host CPU offers, for tests that pick or skip an ISA path."""
from pathlib import Path


def cpu_has(*flags):
    """Whether /proc/cpuinfo lists every flag (False where it cannot be read: not Linux)."""
    try:
        listed = Path("/proc/cpuinfo").read_text().split()
    except OSError:
        return False
    return all(f in listed for f in flags)
