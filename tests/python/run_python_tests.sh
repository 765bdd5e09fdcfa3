#!/usr/bin/env bash
# Runs the Python package's tests (python/tests) with one Python against a headroom binary, then installs the
# package with pip into a scratch venv and runs its headroom-trace command.
#
#   run_python_tests.sh HEADROOM_BIN torch1|torch2
#
# torch1: validation/.venv (Debian's PyTorch 1.13, transformers 4.46): the tracer's tests and its builder check;
# the plan tests skip (applying a plan needs PyTorch 2.4). torch2: the PyTorch 2.x environment of
# validation/setup-torch2 (transformers 5): every test. $HEADROOM_TRACE_PYTHON overrides the Python. Exits 77
# (ctest: skipped) when that Python is not there or has no torch; scripts/test installs both.
set -euo pipefail
headroom=$(realpath "$1")
which=${2:-torch1}
repo=$(cd "$(dirname "$0")/../.." && pwd)
python=${HEADROOM_TRACE_PYTHON:-}
if [[ -z $python && $which == torch2 ]]; then
  python=$("$repo/validation/setup-torch2" --find) || { echo "skipped: no PyTorch 2.x environment (validation/setup-torch2)"; exit 77; }
elif [[ -z $python ]]; then
  python=/usr/bin/python3
  [[ -x $repo/validation/.venv/bin/python ]] && python=$repo/validation/.venv/bin/python
fi
if ! "$python" -c "import torch" 2>/dev/null; then
  echo "skipped: $python has no torch (validation/setup installs Debian's python3-torch)"
  exit 77
fi

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# A copy, so that neither the tests nor pip write into the checkout; the README comes along for its example.
cp -r "$repo/python" "$work/python"
cp "$repo/README.md" "$work/README.md"
find "$work/python" -name __pycache__ -prune -exec rm -rf {} +
(cd "$work/python" && HEADROOM_BIN=$headroom PYTHONDONTWRITEBYTECODE=1 "$python" -m unittest discover -s tests -t . -v)

"$python" -m venv --system-site-packages "$work/venv"
"$work/venv/bin/pip" install -q --no-build-isolation --no-deps "$work/python"
(cd "$work/python" && "$work/venv/bin/headroom-trace" --module tests.sample_modules:TanhMlp --input 4x32 \
  -o "$work/mlp.json" 2>"$work/summary")
grep -q "TanhMlp: .* ops" "$work/summary" || { echo "headroom-trace: no summary line"; cat "$work/summary"; exit 1; }
"$headroom" estimate --model "$work/mlp.json" --budget 1GiB --precision fp32 --no-search >/dev/null
(cd "$work" && HEADROOM_BIN=$headroom "$work/venv/bin/python" -c "import headroom; print(headroom.__all__)" >/dev/null)
echo "the headroom package installed with pip: headroom-trace runs and its graph estimates; import headroom works"
