"""Where the compiled parts are: the `headroom` executable the planner runs in, and the allocator's C library.

Looked for, in order: the environment (HEADROOM_BIN, HEADROOM_ALLOC_LIBRARY), the Python environment's own bin/
and lib/ folders (where scripts/install-python puts them), PATH, and the build folder of the checkout this package
was imported from (build/cli/headroom, build/allocator/cuda/c_abi/libheadroom_cuda_alloc.so).
"""
import os
import pathlib
import shutil
import sys

_CHECKOUT = pathlib.Path(__file__).resolve().parents[2]


class NotInstalled(RuntimeError):
    """A compiled part of Headroom is missing; the message says how to get it."""


def executable():
    candidates = [os.environ.get("HEADROOM_BIN"), pathlib.Path(sys.prefix) / "bin" / "headroom",
                  shutil.which("headroom"), _CHECKOUT / "build" / "cli" / "headroom"]
    for c in candidates:
        if c and os.path.isfile(c) and os.access(c, os.X_OK):
            return str(c)
    raise NotInstalled("the headroom executable was not found (HEADROOM_BIN, this environment's bin/, PATH, "
                       f"{_CHECKOUT / 'build' / 'cli'}): run scripts/install-python from the Headroom checkout")


def allocator_library():
    name = "libheadroom_cuda_alloc.so"
    candidates = [os.environ.get("HEADROOM_ALLOC_LIBRARY"), pathlib.Path(sys.prefix) / "lib" / name,
                  _CHECKOUT / "build" / "allocator" / "cuda" / "c_abi" / name]
    for c in candidates:
        if c and os.path.isfile(c):
            return str(c)
    raise NotInstalled(f"{name} was not found (HEADROOM_ALLOC_LIBRARY, this environment's lib/, "
                       f"{_CHECKOUT / 'build' / 'allocator' / 'cuda' / 'c_abi'}): build Headroom with the CUDA "
                       "toolkit present and run scripts/install-python")
