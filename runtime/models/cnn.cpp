#include "cnn.h"

#include <fmt/format.h>

#include <cmath>

#include "../core/error.h"
#include "layers.h"

namespace pooch {
namespace {

// Adds the ops of one model, naming weights as torchvision does.
struct CnnBuilder {
  Graph& g;
  AddWeight weight;
  int64_t B;

  // A k x k convolution without bias (ResNet's), Kaiming-normal over fan-out.
  TensorId conv(const std::string& name, TensorId x, int64_t cin, int64_t cout, int64_t k,
                int64_t stride, int64_t pad, bool bias = false) {
    const double std_ = std::sqrt(2.0 / static_cast<double>(cout * k * k));
    std::vector<TensorId> in = {x, weight(name + ".weight", DType::f32, {cout, cin, k, k}, true,
                                          WeightInit::Kind::normal, std_)};
    if (bias)
      in.push_back(weight(name + ".bias", DType::f32, {cout}, true, WeightInit::Kind::zeros, 0));
    Attrs a;
    a.set("stride_h", static_cast<double>(stride)).set("stride_w", static_cast<double>(stride));
    a.set("pad_h", static_cast<double>(pad)).set("pad_w", static_cast<double>(pad));
    return g.add_op1("conv2d", in, a, name + ".out");
  }

  // Batch normalisation over c channels with its running statistics.
  TensorId bn(const std::string& name, TensorId x, int64_t c) {
    const TensorId gamma =
        weight(name + ".weight", DType::f32, {c}, true, WeightInit::Kind::constant, 1.0);
    const TensorId beta = weight(name + ".bias", DType::f32, {c}, true, WeightInit::Kind::zeros, 0);
    const TensorId mean =
        weight(name + ".running_mean", DType::f32, {c}, false, WeightInit::Kind::zeros, 0);
    const TensorId var =
        weight(name + ".running_var", DType::f32, {c}, false, WeightInit::Kind::constant, 1.0);
    return g.add_op("batchnorm", {x, gamma, beta, mean, var}, {{"eps", 1e-5}, {"momentum", 0.1}},
                    {name + ".out", name + ".mean", name + ".var"})[0];
  }

  TensorId relu(TensorId x, const std::string& name) { return g.add_op1("relu", {x}, {}, name); }

  TensorId maxpool(TensorId x, int64_t k, int64_t s, int64_t p, const std::string& name) {
    Attrs a;
    a.set("kh", static_cast<double>(k)).set("kw", static_cast<double>(k));
    a.set("stride_h", static_cast<double>(s)).set("stride_w", static_cast<double>(s));
    a.set("pad_h", static_cast<double>(p)).set("pad_w", static_cast<double>(p));
    return g.add_op1("maxpool2d", {x}, a, name);
  }

  // A linear layer: uniform ±bound (PyTorch's default: 1/√fan-in for weight
  // and bias) or normal(0, std) with zero bias (VGG's classifier).
  TensorId linear(const std::string& name, TensorId x, int64_t in, int64_t out, bool vgg_init) {
    const double bound = 1.0 / std::sqrt(static_cast<double>(in));
    const TensorId w = vgg_init ? weight(name + ".weight", DType::f32, {out, in}, true,
                                         WeightInit::Kind::normal, 0.01)
                                : weight(name + ".weight", DType::f32, {out, in}, true,
                                         WeightInit::Kind::uniform, bound);
    const TensorId b =
        vgg_init
            ? weight(name + ".bias", DType::f32, {out}, true, WeightInit::Kind::zeros, 0)
            : weight(name + ".bias", DType::f32, {out}, true, WeightInit::Kind::uniform, bound);
    return g.add_op1("linear", {x, w, b}, {}, name + ".out");
  }
};

// The image input and, once the logits exist, the loss and the outputs.
TensorId add_image_input(Model& m, const ModelSpec& s) {
  const CnnSpec& c = s.cnn;
  const TensorId x = m.graph.add_tensor(
      {"batch.x", DType::f32, {s.run.batch, c.channels, c.height, c.width}, Role::input});
  m.inputs.push_back({"batch.x", x, 0});
  return x;
}

void add_classifier_loss(Model& m, const ModelSpec& s, TensorId logits) {
  Graph& g = m.graph;
  const TensorId cls = g.add_tensor({"batch.class", DType::i32, {s.run.batch}, Role::input});
  m.inputs.push_back({"batch.class", cls, 0, -1.0, false, s.labels});
  const TensorId loss = g.add_op1("softmax_xent_index", {logits, cls}, {}, "loss");
  g.mark_output(logits);
  g.mark_output(loss);
  m.outputs.push_back({"prediction", logits, 0});
  m.outputs.push_back({"loss", loss});
  m.losses.push_back(loss);
}

struct Stages {
  bool bottleneck;
  int blocks[4];
};

Stages resnet_stages(int depth) {
  switch (depth) {
    case 18:
      return {false, {2, 2, 2, 2}};
    case 34:
      return {false, {3, 4, 6, 3}};
    case 50:
      return {true, {3, 4, 6, 3}};
    case 101:
      return {true, {3, 4, 23, 3}};
    case 152:
      return {true, {3, 8, 36, 3}};
    default:
      throw Error(POOCH_ERR_INVALID_ARG, fmt::format("resnet depth {}", depth));
  }
}

}  // namespace

std::unique_ptr<Model> build_resnet_model(const ModelSpec& spec) {
  ModelSpec s = spec;
  s.family = Family::resnet;
  validate_spec(s);
  auto m = new_model(s);
  CnnBuilder b{m->graph, weight_adder(*m), s.run.batch};
  const CnnSpec& c = s.cnn;
  const int64_t w0 = c.base_width;

  TensorId h = add_image_input(*m, s);
  if (c.stem == "imagenet") {
    h = b.relu(b.bn("bn1", b.conv("conv1", h, c.channels, w0, 7, 2, 3), w0), "relu1");
    h = b.maxpool(h, 3, 2, 1, "maxpool");
  } else {
    h = b.relu(b.bn("bn1", b.conv("conv1", h, c.channels, w0, 3, 1, 1), w0), "relu1");
  }
  const Stages st = resnet_stages(c.depth);
  const int64_t expansion = st.bottleneck ? 4 : 1;
  int64_t inplanes = w0;
  for (int layer = 0; layer < 4; ++layer) {
    const int64_t planes = w0 << layer;
    for (int blk = 0; blk < st.blocks[layer]; ++blk) {
      const std::string p = fmt::format("layer{}.{}", layer + 1, blk);
      const int64_t stride = (layer > 0 && blk == 0) ? 2 : 1;
      const int64_t out = planes * expansion;
      TensorId y;
      if (st.bottleneck) {
        y = b.relu(b.bn(p + ".bn1", b.conv(p + ".conv1", h, inplanes, planes, 1, 1, 0), planes),
                   p + ".relu1");
        y = b.relu(b.bn(p + ".bn2", b.conv(p + ".conv2", y, planes, planes, 3, stride, 1), planes),
                   p + ".relu2");
        y = b.bn(p + ".bn3", b.conv(p + ".conv3", y, planes, out, 1, 1, 0), out);
      } else {
        y = b.relu(
            b.bn(p + ".bn1", b.conv(p + ".conv1", h, inplanes, planes, 3, stride, 1), planes),
            p + ".relu1");
        y = b.bn(p + ".bn2", b.conv(p + ".conv2", y, planes, planes, 3, 1, 1), planes);
      }
      TensorId identity = h;
      if (stride != 1 || inplanes != out)
        identity = b.bn(p + ".downsample.1",
                        b.conv(p + ".downsample.0", h, inplanes, out, 1, stride, 0), out);
      h = b.relu(m->graph.add_op1("add", {y, identity}, {}, p + ".sum"), p + ".out");
      inplanes = out;
    }
  }
  h = m->graph.add_op1("global_avgpool", {h}, {}, "avgpool");
  const TensorId logits = b.linear("fc", h, inplanes, s.labels, false);
  add_classifier_loss(*m, s, logits);
  return m;
}

std::unique_ptr<Model> build_vgg_model(const ModelSpec& spec) {
  ModelSpec s = spec;
  s.family = Family::vgg;
  validate_spec(s);
  auto m = new_model(s);
  CnnBuilder b{m->graph, weight_adder(*m), s.run.batch};
  const CnnSpec& c = s.cnn;
  // torchvision's configurations A, B, D, E in units of the base width (0: pooling).
  std::vector<int> cfg;
  switch (c.depth) {
    case 11:
      cfg = {1, 0, 2, 0, 4, 4, 0, 8, 8, 0, 8, 8, 0};
      break;
    case 13:
      cfg = {1, 1, 0, 2, 2, 0, 4, 4, 0, 8, 8, 0, 8, 8, 0};
      break;
    case 16:
      cfg = {1, 1, 0, 2, 2, 0, 4, 4, 4, 0, 8, 8, 8, 0, 8, 8, 8, 0};
      break;
    default:
      cfg = {1, 1, 0, 2, 2, 0, 4, 4, 4, 4, 0, 8, 8, 8, 8, 0, 8, 8, 8, 8, 0};
      break;
  }
  TensorId h = add_image_input(*m, s);
  int64_t ch = c.channels, H = c.height, W = c.width;
  int idx = 0;  // the index in torchvision's `features` Sequential
  for (int v : cfg) {
    if (v == 0) {
      h = b.maxpool(h, 2, 2, 0, fmt::format("features.{}", idx++));
      H /= 2;
      W /= 2;
      continue;
    }
    const int64_t out = c.base_width * v;
    h = b.conv(fmt::format("features.{}", idx++), h, ch, out, 3, 1, 1, true);
    if (c.batchnorm) h = b.bn(fmt::format("features.{}", idx++), h, out);
    h = b.relu(h, fmt::format("features.{}", idx++));
    ch = out;
  }
  // torchvision pools adaptively to 7x7 first, which at 224x224 input is the
  // identity; here the features are flattened at whatever size they have.
  const int64_t flat = ch * H * W;
  h = m->graph.add_op1(
      "reshape", {h},
      {{"rank", 2}, {"d0", static_cast<double>(s.run.batch)}, {"d1", static_cast<double>(flat)}},
      "flatten");
  h = b.relu(b.linear("classifier.0", h, flat, c.hidden, true), "classifier.1");
  if (c.dropout > 0)
    h = m->graph.add_op1("dropout", {h}, {{"p", c.dropout}, {"key", 1}}, "classifier.2");
  h = b.relu(b.linear("classifier.3", h, c.hidden, c.hidden, true), "classifier.4");
  if (c.dropout > 0)
    h = m->graph.add_op1("dropout", {h}, {{"p", c.dropout}, {"key", 2}}, "classifier.5");
  const TensorId logits = b.linear("classifier.6", h, c.hidden, s.labels, true);
  add_classifier_loss(*m, s, logits);
  return m;
}

}  // namespace pooch
