#!/usr/bin/env bash
# Runs the headroom-trace tests (tracer/tests) against a headroom binary, then installs the package with pip
# into a scratch venv and runs its console script. Python: $HEADROOM_TRACE_PYTHON, else validation/.venv (which
# has transformers, for the builder checks), else Debian's /usr/bin/python3. Exits 77 (ctest: skipped) when
# that Python has no torch; scripts/test installs one (validation/setup).
set -euo pipefail
headroom=$(realpath "$1")
repo=$(cd "$(dirname "$0")/../.." && pwd)
python=${HEADROOM_TRACE_PYTHON:-}
if [[ -z $python ]]; then
  python=/usr/bin/python3
  [[ -x $repo/validation/.venv/bin/python ]] && python=$repo/validation/.venv/bin/python
fi
if ! "$python" -c "import torch" 2>/dev/null; then
  echo "skipped: $python has no torch (validation/setup installs Debian's python3-torch)"
  exit 77
fi

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# A copy, so that neither the tests nor pip write into the checkout.
cp -r "$repo/tracer" "$work/tracer"
find "$work/tracer" -name __pycache__ -prune -exec rm -rf {} +
(cd "$work/tracer" && HEADROOM_BIN=$headroom PYTHONDONTWRITEBYTECODE=1 "$python" -m unittest discover -s tests -t . -v)

"$python" -m venv --system-site-packages "$work/venv"
"$work/venv/bin/pip" install -q --no-build-isolation --no-deps "$work/tracer"
(cd "$work/tracer" && "$work/venv/bin/headroom-trace" --module tests.sample_modules:TanhMlp --input 4x32 \
  -o "$work/mlp.json" 2>"$work/summary")
grep -q "TanhMlp: .* ops" "$work/summary" || { echo "headroom-trace: no summary line"; cat "$work/summary"; exit 1; }
"$headroom" estimate --model "$work/mlp.json" --budget 1GiB --precision fp32 --no-search >/dev/null
echo "headroom-trace installed with pip; its graph estimates"
