#!/usr/bin/env bash
# Checks `headroom estimate --engine vllm|sglang` against vLLM's and SGLang's own KV-cache sizing code, on a CPU
# (validation/headroom_validation/serving_reference.py), in the PyTorch 2.x environment of validation/setup-torch2,
# which installs the engines from validation/requirements-serving.txt.
#
#   run_serving_reference.sh HEADROOM_BIN
#
# Exits 77 (ctest: skipped) when that environment is not there or cannot import vLLM's sizing code.
set -euo pipefail
headroom=$(realpath "$1")
repo=$(cd "$(dirname "$0")/../.." && pwd)
python=$("$repo/validation/setup-torch2" --find) || { echo "skipped: no PyTorch 2.x environment (validation/setup-torch2)"; exit 77; }
cd "$repo/validation"
HEADROOM_BIN=$headroom PYTHONDONTWRITEBYTECODE=1 exec "$python" -m headroom_validation.serving_reference
