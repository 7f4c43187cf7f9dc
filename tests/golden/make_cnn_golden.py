#!/usr/bin/python3
"""Writes tests/golden/resnet_tiny.json: a tiny ResNet-18 computed by PyTorch.

The network is the one runtime/models/cnn.cpp builds for
{"family": "resnet", "depth": 18, "width": 2, "stem": "imagenet"} (torchvision's
ResNet-18 with every stage's channels divided by 32), written with plain
torch.nn (Debian ships no torchvision) and torchvision's state-dict names.
The weights are drawn as torchvision initialises them; BN's running
statistics start at 0 and 1.

PyTorch computes in float64 (the weights and the batch are float32 values):
the reference is then the exact answer and the test measures pooch's
float32 error alone. The file holds the batch (x f32[B,3,H,W], class ids), every parameter and
buffer, the forward values (logits, loss: mean softmax cross-entropy), every
parameter's gradient of one training-mode step, and the losses, parameters
and running statistics after 10 steps of torch.optim.SGD with momentum on
the same batch (loss i is computed before update i+1, as pooch's training
step reports it). tests/golden/test_cnn_golden.cpp builds the model with
pooch's builder and compares.

    /usr/bin/python3 tests/golden/make_cnn_golden.py            # writes the file
    /usr/bin/python3 tests/golden/make_cnn_golden.py --check    # compares instead
"""
import json
import os
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "resnet_tiny.json")

B, C, H, W, CLASSES, WIDTH = 16, 3, 32, 32, 5, 2
SGD = {"lr": 0.01, "momentum": 0.9, "steps": 10}


class Block(nn.Module):
    def __init__(self, inp, planes, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(inp, planes, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.downsample = None
        if stride != 1 or inp != planes:
            self.downsample = nn.Sequential(nn.Conv2d(inp, planes, 1, stride, bias=False),
                                            nn.BatchNorm2d(planes))

    def forward(self, x):
        y = F.relu(self.bn1(self.conv1(x)))
        y = self.bn2(self.conv2(y))
        return F.relu(y + (self.downsample(x) if self.downsample is not None else x))


class ResNet18(nn.Module):
    def __init__(self, w):
        super().__init__()
        self.conv1 = nn.Conv2d(C, w, 7, 2, 3, bias=False)
        self.bn1 = nn.BatchNorm2d(w)
        inp = w
        for i in range(4):
            planes = w << i
            blocks = [Block(inp, planes, 1 if i == 0 else 2), Block(planes, planes, 1)]
            setattr(self, f"layer{i + 1}", nn.Sequential(*blocks))
            inp = planes
        self.fc = nn.Linear(inp, CLASSES)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.bn1(self.conv1(x))), 3, 2, 1)
        for i in range(4):
            x = getattr(self, f"layer{i + 1}")(x)
        return self.fc(x.mean(dim=(2, 3)))


def f32_list(t):
    return [float(f"{v:.9g}") for v in t.detach().reshape(-1).tolist()]


def state(model):
    """Parameters and running statistics by torchvision's names."""
    return {k: v for k, v in model.state_dict().items() if not k.endswith("num_batches_tracked")}


def main():
    torch.manual_seed(10)
    model = ResNet18(WIDTH)
    # torchvision's initialisation (pooch's own): Kaiming normal over fan-out
    # for the convolutions, BN 1 and 0, PyTorch's default Linear. Weights of
    # this distribution keep the 10 steps well conditioned: PyTorch's float32
    # run stays within 6e-5 of this float64 one; arbitrary random weights
    # make the trajectory chaotic (float32 and float64 part after 3 steps).
    for mod in model.modules():
        if isinstance(mod, nn.Conv2d):
            nn.init.kaiming_normal_(mod.weight, mode="fan_out", nonlinearity="relu")
    # Multiples of 1/32 in [-4, 4): exact in float32 and short in the file.
    x = torch.randint(-128, 128, (B, C, H, W)).float() / 32
    cls = torch.arange(B) % CLASSES
    init = {k: f32_list(v) for k, v in state(model).items()}
    # Everything below in float64: the reference is the exact answer, so the
    # comparison measures pooch's float32 rounding alone.
    model = model.double()
    x = x.double()
    shapes = {k: list(v.shape) for k, v in state(model).items()}

    model.train()
    logits = model(x)
    loss = F.cross_entropy(logits, cls)
    loss.backward()
    grads = {n: f32_list(p.grad) for n, p in model.named_parameters()}
    forward = {"logits": f32_list(logits), "loss": float(f"{loss.item():.9g}")}

    # 10 SGD steps from the initial state again (the pass above moved the
    # running statistics: restore them).
    model2 = ResNet18(WIDTH).double()
    model2.load_state_dict({k: torch.tensor(v, dtype=torch.float64).reshape(shapes[k]) for k, v in init.items()},
                           strict=False)
    model2.train()
    opt = torch.optim.SGD(model2.parameters(), lr=SGD["lr"], momentum=SGD["momentum"])
    losses = []
    for _ in range(SGD["steps"]):
        opt.zero_grad()
        l = F.cross_entropy(model2(x), cls)
        l.backward()
        opt.step()
        losses.append(float(f"{l.item():.9g}"))
    final = {k: f32_list(v) for k, v in state(model2).items()}

    # PyTorch's own float32 run of the same steps, against this reference:
    # the rounding noise any float32 implementation starts from (printed).
    model3 = ResNet18(WIDTH)
    model3.load_state_dict({k: torch.tensor(v).reshape(shapes[k]) for k, v in init.items()},
                           strict=False)
    opt3 = torch.optim.SGD(model3.parameters(), lr=SGD["lr"], momentum=SGD["momentum"])
    l32 = []
    for _ in range(SGD["steps"]):
        opt3.zero_grad()
        l = F.cross_entropy(model3(x.float()), cls)
        l.backward()
        opt3.step()
        l32.append(l.item())
    worst = max((torch.tensor(final[k]) - v.double().reshape(-1)).norm().item() /
                max(torch.tensor(final[k]).norm().item(), 1e-30)
                for k, v in state(model3).items())
    lw = (torch.tensor(l32) - torch.tensor(losses)).norm().item() / torch.tensor(losses).norm().item()
    print(f"PyTorch float32 against this float64 reference after {SGD['steps']} steps: "
          f"losses {lw:.3g}, parameters and statistics {worst:.3g} (norm-wise, worst tensor)")

    out = {
        "spec": {"family": "resnet", "depth": 18, "width": WIDTH, "stem": "imagenet",
                 "input": {"channels": C, "height": H, "width": W}, "classes": CLASSES,
                 "batch": B},
        "x": f32_list(x), "classes": cls.tolist(), "shapes": shapes, "init": init,
        "forward": forward, "grad": grads,
        "sgd": dict(SGD, losses=losses, final=final),
    }
    text = json.dumps(out, separators=(",", ":")) + "\n"
    if "--check" in sys.argv:
        with open(OUT) as f:
            old = json.load(f)
        ok = old == json.loads(text)
        print("resnet_tiny.json is up to date" if ok else "resnet_tiny.json differs")
        sys.exit(0 if ok else 1)
    with open(OUT, "w") as f:
        f.write(text)
    print(f"wrote {OUT} ({len(text)} bytes)")


if __name__ == "__main__":
    main()
