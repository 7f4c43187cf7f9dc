#!/work/venv-peers/bin/python
"""A manual check of pooch-run import/export on torchvision's own full-size
networks (not run by meson: the files are 100-550 MB and torchvision is not
a Debian package). For each name given (default: resnet50 vgg16), it builds
torchvision.models.NAME() with random weights, moves its BN statistics by
two training-mode passes, saves the state dict with safetensors, imports it
with pooch-run (nothing given but --batch), predicts two random 224x224
images, compares the logits with PyTorch's float64 eval-mode ones, exports
the model back and loads the export into torchvision with strict=True.

    PYTHONPATH=DIR_WITH_TORCHVISION /work/venv-peers/bin/python \\
        tests/golden/check_torchvision_import.py build/apps/pooch-run WORKDIR [NAME...]
"""
import os
import subprocess
import sys
import time

import numpy as np
import torch
import torchvision
from safetensors.torch import load_file, save_file


def check(run, work, name):
    torch.manual_seed(0)
    m = getattr(torchvision.models, name)()
    m.train()
    with torch.no_grad():
        for _ in range(2):
            m(torch.randn(4, 3, 224, 224))
    m.eval()
    src, model, x_path, pred, back = (os.path.join(work, name + s) for s in
                                      (".safetensors", ".pooch", ".x.npy", ".pred.npy", ".back.safetensors"))
    save_file({k: v.contiguous() for k, v in m.state_dict().items()}, src)
    t = time.time()
    subprocess.run([run, "import", "--from", src, "--batch", "2", "--out", model], check=True)
    secs = time.time() - t
    x = torch.rand(2, 3, 224, 224)
    np.save(x_path, x.numpy())
    subprocess.run([run, "predict", "--model", model, "--data", x_path, "--out", pred, "--threads", "2",
                    "--device", "cpu"], check=True)
    with torch.no_grad():
        ref = m.double()(x.double())
    err = ((torch.from_numpy(np.load(pred)).double() - ref).norm() / ref.norm()).item()
    subprocess.run([run, "export", "--model", model, "--to", back], check=True)
    m2 = getattr(torchvision.models, name)()
    m2.load_state_dict(load_file(back), strict=True)
    same = all(torch.equal(a, b) for (k, a), b in zip(m.float().state_dict().items(), m2.state_dict().values())
               if not k.endswith("num_batches_tracked"))
    print(f"{name}: {os.path.getsize(src) / 1e6:.0f} MB imported in {secs:.2f} s; logits relative error "
          f"{err:.3g}; export loads with strict=True, weights {'identical' if same else 'DIFFER'}")
    for p in (src, model, x_path, pred, back):
        os.remove(p)
    return err < 1e-4 and same


def main():
    run, work, names = sys.argv[1], sys.argv[2], sys.argv[3:] or ["resnet50", "vgg16"]
    ok = all([check(run, work, n) for n in names])
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
