#include "lora.h"

#include <fmt/format.h>

#include <cstring>
#include <map>
#include <span>
#include <vector>

#include "../core/error.h"
#include "../models/build.h"
#include "../models/gpt.h"
#include "model_io.h"

namespace pooch {

namespace {

// The f32 values of tensor `name` [rows, cols] in `f`; error naming the file
// when it is missing or shaped otherwise.
std::vector<float> read_matrix(const PoochFile& f, const std::string& name, int64_t rows,
                               int64_t cols) {
  const TensorEntry* e = f.find(name);
  if (!e || e->dtype != DType::f32 || e->shape != Shape{rows, cols})
    throw Error(
        POOCH_ERR_BAD_INPUT,
        fmt::format("{}: tensor '{}' must be f32 [{}, {}]{}", f.path(), name, rows, cols,
                    e ? fmt::format(", not {} {}", dtype_name(e->dtype), shape_str(e->shape))
                      : ", and the file has none"));
  const auto bytes = f.data(*e);
  std::vector<float> v(static_cast<size_t>(rows * cols));
  std::memcpy(v.data(), bytes.data(), v.size() * sizeof(float));
  return v;
}

}  // namespace

LoraMergeReport merge_lora(const std::string& in, const std::string& out) {
  const LoadedFile src = load_model_file(in);
  if (!src.has_spec || src.spec.family != Family::gpt || src.spec.gpt.lora.rank == 0)
    throw Error(POOCH_ERR_BAD_INPUT,
                fmt::format("{}: has no LoRA adapters to merge (a gpt model finetuned with "
                            "--lora-rank has them)",
                            in));
  const ModelSpec& with = src.spec;
  ModelSpec plain = with;
  plain.gpt.lora = LoraSpec{};
  const std::unique_ptr<Model> merged = build_model(plain);
  const PoochFile& f = src.file;

  // The adapted linears' merged weights, in double: W + s·B·A.
  const int64_t r = with.gpt.lora.rank;
  const double s = with.gpt.lora.scale();
  std::map<std::string, std::vector<float>, std::less<>> folded;
  for (const std::string& lin : lora_linears(with)) {
    const std::string wname = lin + ".weight";
    const TensorEntry* e = f.find(wname);
    if (!e || e->shape.size() != 2)
      throw Error(POOCH_ERR_BAD_INPUT, fmt::format("{}: has no 2-d tensor '{}'", in, wname));
    const int64_t O = e->shape[0], I = e->shape[1];
    std::vector<float> w = read_matrix(f, wname, O, I);
    const std::vector<float> a = read_matrix(f, lin + ".lora_A.weight", r, I);
    const std::vector<float> b = read_matrix(f, lin + ".lora_B.weight", O, r);
    for (int64_t o = 0; o < O; ++o)
      for (int64_t i = 0; i < I; ++i) {
        double d = 0;
        for (int64_t k = 0; k < r; ++k)
          d += static_cast<double>(b[o * r + k]) * static_cast<double>(a[k * I + i]);
        w[o * I + i] = static_cast<float>(static_cast<double>(w[o * I + i]) + s * d);
      }
    folded[wname] = std::move(w);
  }

  const LoraMergeReport rep{static_cast<int64_t>(folded.size()), r, s};
  std::map<std::string, std::span<const std::byte>, std::less<>> weights;
  const Graph& g = merged->graph;
  for (size_t t = 0; t < g.num_tensors(); ++t) {
    const TensorDesc& d = g.tensor(static_cast<TensorId>(t));
    if (d.role != Role::weight) continue;
    if (const auto it = folded.find(d.name); it != folded.end()) {
      weights[d.name] = std::as_bytes(std::span(it->second));
    } else if (const TensorEntry* e = f.find(d.name)) {
      weights[d.name] = f.data(*e);
    }
    // A missing weight is named by save_model.
  }
  save_model(*merged, out, weights);
  return rep;
}

}  // namespace pooch
