#!/usr/bin/python3
"""bench/peers/cnn_torch.py — the PyTorch side of bench/cnn/run.py.

Trains torchvision's ResNet-18 or ResNet-50 (written with plain torch.nn:
Debian ships no torchvision; the same layers pooch's resnet builder emits)
on the images of X.npy (uint8 N×H×W×C) and the class ids of Y.npy, with SGD
(momentum 0.9), for --steps batches, and prints one JSON line: steps,
images, seconds (the training loop, first step included), images/s.

    /usr/bin/python3 bench/peers/cnn_torch.py --depth 18 --x X.npy --y Y.npy \
        --batch 16 --steps 10 --threads 2
"""
import argparse
import json
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F


class Basic(nn.Module):
    expansion = 1

    def __init__(self, inp, planes, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(inp, planes, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        out = planes
        self.downsample = None
        if stride != 1 or inp != out:
            self.downsample = nn.Sequential(nn.Conv2d(inp, out, 1, stride, bias=False),
                                            nn.BatchNorm2d(out))

    def forward(self, x):
        y = F.relu(self.bn1(self.conv1(x)))
        y = self.bn2(self.conv2(y))
        return F.relu(y + (self.downsample(x) if self.downsample is not None else x))


class Bottleneck(nn.Module):
    expansion = 4

    def __init__(self, inp, planes, stride):
        super().__init__()
        out = planes * 4
        self.conv1 = nn.Conv2d(inp, planes, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, stride, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.conv3 = nn.Conv2d(planes, out, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(out)
        self.downsample = None
        if stride != 1 or inp != out:
            self.downsample = nn.Sequential(nn.Conv2d(inp, out, 1, stride, bias=False),
                                            nn.BatchNorm2d(out))

    def forward(self, x):
        y = F.relu(self.bn1(self.conv1(x)))
        y = F.relu(self.bn2(self.conv2(y)))
        y = self.bn3(self.conv3(y))
        return F.relu(y + (self.downsample(x) if self.downsample is not None else x))


def resnet(depth, classes, channels):
    block, layers = {18: (Basic, [2, 2, 2, 2]), 34: (Basic, [3, 4, 6, 3]),
                     50: (Bottleneck, [3, 4, 6, 3])}[depth]
    mods = [nn.Conv2d(channels, 64, 7, 2, 3, bias=False), nn.BatchNorm2d(64), nn.ReLU(),
            nn.MaxPool2d(3, 2, 1)]
    inp = 64
    for i, n in enumerate(layers):
        planes = 64 << i
        for b in range(n):
            mods.append(block(inp, planes, 2 if (i > 0 and b == 0) else 1))
            inp = planes * block.expansion
    mods += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(inp, classes)]
    return nn.Sequential(*mods)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--depth", type=int, default=18)
    ap.add_argument("--x", required=True)
    ap.add_argument("--y", required=True)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--lr", type=float, default=0.01)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(1)
    x = np.load(a.x)
    y = np.load(a.y)
    classes = int(y.max()) + 1
    # As pooch-run: [0, 1] pixels, normalised per channel over the set.
    xt = torch.from_numpy(x).permute(0, 3, 1, 2).float() / 255.0
    mean = xt.mean(dim=(0, 2, 3), keepdim=True)
    std = xt.std(dim=(0, 2, 3), unbiased=False, keepdim=True)
    xt = ((xt - mean) / std).contiguous()
    yt = torch.from_numpy(y.astype(np.int64))
    model = resnet(a.depth, classes, xt.shape[1])
    model.train()
    opt = torch.optim.SGD(model.parameters(), lr=a.lr, momentum=0.9)
    n = xt.shape[0]
    t0 = time.perf_counter()
    for s in range(a.steps + 1):
        if s == 1:  # the first step warms up (oneDNN primitives, allocator): not timed
            t0 = time.perf_counter()
        i = (s * a.batch) % max(1, n - a.batch + 1)
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(xt[i:i + a.batch]), yt[i:i + a.batch])
        loss.backward()
        opt.step()
    secs = time.perf_counter() - t0
    print(json.dumps({"steps": a.steps, "images": a.steps * a.batch, "seconds": secs,
                      "images_per_s": a.steps * a.batch / secs, "loss": float(loss)}))


if __name__ == "__main__":
    main()
