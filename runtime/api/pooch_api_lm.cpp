// The C API of language-model files: the BPE tokenizer, token data and
// GPT-2 checkpoint import and export. Argument checks, then a call into the
// runtime through run_guarded (no logic of its own).
#include <fmt/format.h>

#include <cstdlib>
#include <cstring>
#include <memory>
#include <nlohmann/json.hpp>

#include "../../formats/bpe_tokenizer.h"
#include "../../formats/token_file.h"
#include "../core/error.h"
#include "../models/build.h"
#include "../train/gpt_io.h"
#include "../train/lora.h"
#include "api_guard.h"
#include "pooch/pooch.h"

struct pooch_tokenizer {
  pooch::bpe::Tokenizer tok;
};

namespace {

using pooch::api::fail_arg;
using pooch::api::run_guarded;

// The gpt family's spec for a checkpoint's config (docs/CLI.md "gpt spec").
std::unique_ptr<pooch::Model> build_gpt(const pooch::gpt_ckpt::GptConfig& c) {
  const nlohmann::json spec = {{"family", "gpt"},
                               {"n_layer", c.n_layer},
                               {"n_head", c.n_head},
                               {"n_embd", c.n_embd},
                               {"n_ctx", c.n_ctx},
                               {"vocab_size", c.vocab_size},
                               {"layer_norm_epsilon", c.layer_norm_epsilon}};
  try {
    return pooch::build_model(pooch::spec_from_json(spec.dump(), "the imported config"));
  } catch (const pooch::Error& e) {
    throw pooch::Error(e.code(),
                       fmt::format("building the gpt model (n_layer {}, n_head {}, "
                                   "n_embd {}, n_ctx {}, vocab_size {}): {}",
                                   c.n_layer, c.n_head, c.n_embd, c.n_ctx, c.vocab_size, e.what()));
  }
}

}  // namespace

extern "C" {

pooch_status pooch_tokenizer_load(const char* vocab_json, const char* merges_txt,
                                  pooch_tokenizer** out) {
  if (!vocab_json || !merges_txt || !out)
    return fail_arg("pooch_tokenizer_load: vocab_json, merges_txt and out must not be NULL");
  *out = nullptr;
  return run_guarded([&] {
    auto t = std::make_unique<pooch_tokenizer>(
        pooch_tokenizer{pooch::bpe::Tokenizer::load(vocab_json, merges_txt)});
    *out = t.release();
  });
}

void pooch_tokenizer_free(pooch_tokenizer** t) {
  if (!t) return;
  delete *t;
  *t = nullptr;
}

int64_t pooch_tokenizer_vocab_size(const pooch_tokenizer* t) {
  return t ? t->tok.vocab_size() : -1;
}

pooch_status pooch_tokenizer_encode(const pooch_tokenizer* t, const char* text, size_t len,
                                    int32_t* ids, int64_t cap, int64_t* count) {
  if (!t || !count || (!text && len > 0) || cap < 0 || (!ids && cap > 0))
    return fail_arg(
        "pooch_tokenizer_encode: t and count must not be NULL, text not NULL when len > 0, "
        "cap >= 0 and ids not NULL when cap > 0");
  *count = 0;
  return run_guarded([&] {
    const std::vector<int32_t> v = t->tok.encode(std::string_view(text ? text : "", len));
    *count = static_cast<int64_t>(v.size());
    const size_t n = std::min(v.size(), static_cast<size_t>(cap));
    if (n > 0) std::memcpy(ids, v.data(), n * sizeof(int32_t));
  });
}

pooch_status pooch_tokenizer_token(const pooch_tokenizer* t, int32_t id, const char** bytes,
                                   size_t* len) {
  if (!t || !bytes || !len)
    return fail_arg("pooch_tokenizer_token: t, bytes and len must not be NULL");
  *bytes = nullptr;
  *len = 0;
  return run_guarded([&] {
    const std::string& b = t->tok.token_bytes(id);
    *bytes = b.data();
    *len = b.size();
  });
}

pooch_status pooch_tokens_load(const char* path, int bytes, int32_t** tokens, int64_t* count) {
  if (!path || !tokens || !count)
    return fail_arg("pooch_tokens_load: path, tokens and count must not be NULL");
  *tokens = nullptr;
  *count = 0;
  return run_guarded([&] {
    const std::vector<int32_t> v =
        bytes ? pooch::tokens::read_bytes(path) : pooch::tokens::read_llmc(path);
    auto* p = static_cast<int32_t*>(std::malloc(std::max<size_t>(v.size(), 1) * sizeof(int32_t)));
    if (!p) throw std::bad_alloc();
    if (!v.empty()) std::memcpy(p, v.data(), v.size() * sizeof(int32_t));
    *tokens = p;
    *count = static_cast<int64_t>(v.size());
  });
}

void pooch_tokens_free(int32_t** tokens) {
  if (!tokens) return;
  std::free(*tokens);
  *tokens = nullptr;
}

pooch_status pooch_tokens_save(const char* path, const int32_t* tokens, int64_t count) {
  if (!path || count < 0 || (!tokens && count > 0))
    return fail_arg("pooch_tokens_save: path must not be NULL, count >= 0, tokens not NULL");
  return run_guarded(
      [&] { pooch::tokens::write_llmc(path, std::vector<int32_t>(tokens, tokens + count)); });
}

pooch_status pooch_gpt_import(const char* from, const char* out_path) {
  if (!from || !out_path) return fail_arg("pooch_gpt_import: from and out_path must not be NULL");
  return run_guarded([&] { pooch::import_gpt(from, out_path, build_gpt); });
}

pooch_status pooch_gpt_export(const char* model_path, const char* out_dir) {
  if (!model_path || !out_dir)
    return fail_arg("pooch_gpt_export: model_path and out_dir must not be NULL");
  return run_guarded([&] { pooch::export_gpt(model_path, out_dir); });
}

pooch_status pooch_lora_merge(const char* model_path, const char* out_path) {
  if (!model_path || !out_path)
    return fail_arg("pooch_lora_merge: model_path and out_path must not be NULL");
  return run_guarded([&] { pooch::merge_lora(model_path, out_path); });
}

}  // extern "C"
