#!/work/venv-peers/bin/python
"""Writes the torchvision-layout state dicts that tests/golden/test_cnn_import.cpp
imports, and the logits PyTorch computes from them in eval mode.

torchvision is not a Debian package, so the networks are written here with
plain torch.nn, module for module as torchvision writes them (the same
attribute names, hence the same state-dict names: conv1.weight,
bn1.running_mean, layer1.0.downsample.0.weight, features.1.num_batches_tracked,
classifier.6.bias, ...), with every stage's channels divided by a factor so
the committed files stay small:

  resnet18_tiny.safetensors   resnet-18, base width 4 (torchvision: 64)
  resnet50_tiny.safetensors   resnet-50 (bottleneck blocks), base width 2
  vgg11bn_tiny.safetensors    vgg-11 with batch normalisation, base width 2,
                              hidden 8; its classifier takes the 1x1 feature
                              map of a 32x32 image (torchvision pools
                              adaptively to 7x7 first, the identity at 224x224)

When torchvision can be imported (PYTHONPATH=DIR holding a torchvision
wheel's files), the script also checks that each model's state-dict names are
torchvision's resnet18 / resnet50 / vgg11_bn names and that every shape is
torchvision's with the channels scaled.

BN's running statistics are moved away from 0 and 1 by a few training-mode
passes (and the affine parameters perturbed), so the import test sees every
buffer land where it belongs. The logits are computed in float64 from the
float32 weights (the exact answer for those weights) in eval mode.

    /work/venv-peers/bin/python tests/golden/make_cnn_import_golden.py
"""
import json
import os

import torch
import torch.nn as nn
from safetensors.torch import save_file

HERE = os.path.dirname(os.path.abspath(__file__))
C, H, W, CLASSES, B = 3, 32, 32, 5, 2


class BasicBlock(nn.Module):
    expansion = 1

    def __init__(self, inp, planes, stride, downsample):
        super().__init__()
        self.conv1 = nn.Conv2d(inp, planes, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(planes, planes, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.downsample = downsample

    def forward(self, x):
        y = self.relu(self.bn1(self.conv1(x)))
        y = self.bn2(self.conv2(y))
        return self.relu(y + (self.downsample(x) if self.downsample is not None else x))


class Bottleneck(nn.Module):
    expansion = 4

    def __init__(self, inp, planes, stride, downsample):
        super().__init__()
        self.conv1 = nn.Conv2d(inp, planes, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, stride, 1, bias=False)  # torchvision v1.5
        self.bn2 = nn.BatchNorm2d(planes)
        self.conv3 = nn.Conv2d(planes, planes * 4, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(planes * 4)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = downsample

    def forward(self, x):
        y = self.relu(self.bn1(self.conv1(x)))
        y = self.relu(self.bn2(self.conv2(y)))
        y = self.bn3(self.conv3(y))
        return self.relu(y + (self.downsample(x) if self.downsample is not None else x))


class ResNet(nn.Module):
    def __init__(self, block, layers, width, classes):
        super().__init__()
        self.inplanes = width
        self.conv1 = nn.Conv2d(C, width, 7, 2, 3, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(3, 2, 1)
        for i, n in enumerate(layers):
            setattr(self, f"layer{i + 1}", self._make_layer(block, width << i, n, 1 if i == 0 else 2))
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear((width << 3) * block.expansion, classes)

    def _make_layer(self, block, planes, n, stride):
        down = None
        if stride != 1 or self.inplanes != planes * block.expansion:
            down = nn.Sequential(nn.Conv2d(self.inplanes, planes * block.expansion, 1, stride, bias=False),
                                 nn.BatchNorm2d(planes * block.expansion))
        blocks = [block(self.inplanes, planes, stride, down)]
        self.inplanes = planes * block.expansion
        blocks += [block(self.inplanes, planes, 1, None) for _ in range(1, n)]
        return nn.Sequential(*blocks)

    def forward(self, x):
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        for i in range(4):
            x = getattr(self, f"layer{i + 1}")(x)
        return self.fc(torch.flatten(self.avgpool(x), 1))


class VGG(nn.Module):
    CFG_A = [1, "M", 2, "M", 4, 4, "M", 8, 8, "M", 8, 8, "M"]  # vgg-11

    def __init__(self, width, hidden, classes, flat_hw):
        super().__init__()
        layers, ch = [], C
        for v in self.CFG_A:
            if v == "M":
                layers.append(nn.MaxPool2d(2, 2))
            else:
                layers += [nn.Conv2d(ch, v * width, 3, padding=1), nn.BatchNorm2d(v * width),
                           nn.ReLU(inplace=True)]
                ch = v * width
        self.features = nn.Sequential(*layers)
        self.classifier = nn.Sequential(
            nn.Linear(ch * flat_hw, hidden), nn.ReLU(True), nn.Dropout(),
            nn.Linear(hidden, hidden), nn.ReLU(True), nn.Dropout(), nn.Linear(hidden, classes))

    def forward(self, x):
        return self.classifier(torch.flatten(self.features(x), 1))


def torchvision_check(name, model):
    """The names are torchvision's, in its order; ranks and kernel sizes its own."""
    try:
        import torchvision
    except ImportError:
        print(f"{name}: torchvision not importable; layout not cross-checked")
        return
    tv = getattr(torchvision.models, name)(num_classes=CLASSES).state_dict()
    ours = model.state_dict()
    assert list(tv) == list(ours), f"{name}: names differ from torchvision's"
    for k, v in tv.items():
        want, got = list(v.shape), list(ours[k].shape)
        assert len(want) == len(got) and want[2:] == got[2:], f"{name}: {k} {got} vs {want}"
    print(f"{name}: names, ranks and kernel sizes are torchvision's ({len(tv)} tensors)")


def settle(model, gen):
    """Moves BN's running statistics and affine parameters off their initial values."""
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, nn.BatchNorm2d):
                m.weight.add_(0.1 * torch.randn(m.weight.shape, generator=gen))
                m.bias.add_(0.1 * torch.randn(m.bias.shape, generator=gen))
        model.train()
        for _ in range(3):
            model(torch.randn(8, C, H, W, generator=gen))
    model.eval()


def f32_list(t):
    return [float(f"{v:.9g}") for v in t.detach().reshape(-1).tolist()]


def main():
    torch.manual_seed(11)
    gen = torch.Generator().manual_seed(12)
    x = torch.randint(-128, 128, (B, C, H, W), generator=gen).float() / 32  # exact in float32
    models = {
        "resnet18_tiny": (ResNet(BasicBlock, [2, 2, 2, 2], 4, CLASSES), "resnet18",
                          {"family": "resnet", "depth": 18, "width": 4, "stem": "imagenet"}),
        "resnet50_tiny": (ResNet(Bottleneck, [3, 4, 6, 3], 2, CLASSES), "resnet50",
                          {"family": "resnet", "depth": 50, "width": 2, "stem": "imagenet"}),
        "vgg11bn_tiny": (VGG(2, 8, CLASSES, 1), "vgg11_bn",
                         {"family": "vgg", "depth": 11, "width": 2, "batchnorm": True,
                          "hidden": 8}),
    }
    out = {"x": f32_list(x), "batch": B, "models": {}}
    for name, (model, tv_name, spec) in models.items():
        settle(model, gen)
        torchvision_check(tv_name, model)
        sd = {k: v.contiguous() for k, v in model.state_dict().items()}
        path = os.path.join(HERE, name + ".safetensors")
        save_file(sd, path)
        with torch.no_grad():
            logits = model.double()(x.double())
        spec = dict(spec, input={"channels": C, "height": H, "width": W}, classes=CLASSES)
        out["models"][name] = {"spec": spec, "tensors": len(sd), "logits": f32_list(logits)}
        print(f"wrote {path} ({os.path.getsize(path)} bytes, {len(sd)} tensors)")
    path = os.path.join(HERE, "cnn_import.json")
    with open(path, "w") as f:
        f.write(json.dumps(out, separators=(",", ":")) + "\n")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
