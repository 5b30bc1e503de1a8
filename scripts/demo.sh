#!/usr/bin/env bash
# Set up (scripts/setup.sh) and run the main job (scripts/demo.py).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh >/dev/null
exec .venv/bin/python scripts/demo.py "$@"
