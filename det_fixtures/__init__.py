"""Models, inputs and pinned digests shared by the tests, the scripts and the benchmarks: the
embedded real models (real_models), synthetic checkpoints (synthetic), the contract's input sets
(contract_inputs, accuracy), the digest helpers (certification), the pins (pins) and the host CPU's flags (host). Importable
from the repository root: pytest.ini puts it on the path for tests, and scripts/setup.sh adds the
root to the virtual environment (a .pth file) for scripts and benchmarks."""
