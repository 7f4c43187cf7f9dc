#!/usr/bin/env python3
"""safetensors compatibility goldens for tests/unit/test_safetensors.cpp.

Writes tests/golden/lm/python_written.safetensors with the `safetensors`
package (its numpy and torch front ends), holding tensors whose values follow
from a formula the C++ test recomputes:

    value[i] = (i % 97) * 0.25 - 12     for every float tensor (i: flat index)
    value[i] = i * 7 - 30               for every integer tensor

and metadata {"format": "pt", "source": "safetensors-python"}.

With --check PATH it instead loads PATH (a file pooch wrote: the C++ test
writes tests/golden/lm/pooch_written.safetensors when POOCH_WRITE_GOLDEN is
set) with the Python package and checks the same formula and metadata, so
both directions are covered: Python reads pooch's files, pooch reads
Python's.

Run with a Python that has safetensors, numpy and torch (/work/venv-peers):
    python tests/golden/make_safetensors_golden.py
    python tests/golden/make_safetensors_golden.py --check tests/golden/lm/pooch_written.safetensors
"""
import os
import sys

import numpy as np

SHAPES = {
    "a.f32": ((3, 5), "float32"),
    "b.f16": ((4, 2, 3), "float16"),
    "c.bf16": ((7,), "bfloat16"),
    "d.f64": ((2, 2), "float64"),
    "e.i64": ((5,), "int64"),
    "f.i32": ((2, 3), "int32"),
    "g.u8": ((6,), "uint8"),
    "h.empty": ((0, 4), "float32"),
    "i.scalar": ((), "float32"),
}


def value(name, shape, dtype):
    n = int(np.prod(shape)) if shape else 1
    i = np.arange(n, dtype=np.int64)
    if dtype in ("float32", "float16", "bfloat16", "float64"):
        v = (i % 97) * 0.25 - 12
    elif dtype == "uint8":
        v = i * 7 + 1
    else:
        v = i * 7 - 30
    return v.reshape(shape)


def main():
    import torch
    from safetensors.torch import load_file, save_file
    from safetensors import safe_open
    here = os.path.dirname(os.path.abspath(__file__))
    tdt = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16,
           "float64": torch.float64, "int64": torch.int64, "int32": torch.int32,
           "uint8": torch.uint8}
    if len(sys.argv) == 3 and sys.argv[1] == "--check":
        path = sys.argv[2]
        got = load_file(path)
        with safe_open(path, "pt") as f:
            meta = f.metadata()
        assert meta == {"format": "pt", "source": "pooch"}, meta
        assert set(got) == set(SHAPES), sorted(got)
        for name, (shape, dtype) in SHAPES.items():
            t = got[name]
            assert tuple(t.shape) == shape and t.dtype == tdt[dtype], (name, t.shape, t.dtype)
            want = torch.tensor(value(name, shape, dtype)).to(tdt[dtype])
            assert torch.equal(t, want), name
        print(f"{path}: {len(got)} tensors read by safetensors {__import__('safetensors').__version__}, all equal")
        return
    tensors = {name: torch.tensor(value(name, shape, dtype)).to(tdt[dtype]).contiguous()
               for name, (shape, dtype) in SHAPES.items()}
    out = os.path.join(here, "lm", "python_written.safetensors")
    save_file(tensors, out, metadata={"format": "pt", "source": "safetensors-python"})
    print("wrote", out, os.path.getsize(out), "bytes")


if __name__ == "__main__":
    main()
