#!/usr/bin/env bash
# Runs a GPU test binary, or exits 77 (ctest: skipped) when this machine has
# no CUDA driver for it to load.
if ! ldconfig -p 2>/dev/null | grep -q 'libcuda\.so\.1'; then
  echo "skipped: no CUDA driver (libcuda.so.1) on this machine"
  exit 77
fi
exec "$@"
