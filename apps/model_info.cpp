#include "model_info.h"

namespace cli {

const char* dtype_str(pooch_dtype t) {
  switch (t) {
    case POOCH_DTYPE_F32:
      return "f32";
    case POOCH_DTYPE_F64:
      return "f64";
    case POOCH_DTYPE_I32:
      return "i32";
    case POOCH_DTYPE_U16:
      return "u16";
    default:
      return "other";
  }
}

namespace {

Json tensor_json(const pooch_tensor_info& t) {
  Json shape = Json::array();
  for (int d = 0; d < t.rank; ++d) shape.push_back(t.shape[d]);
  return {{"name", t.name},
          {"dtype", dtype_str(t.dtype)},
          {"shape", shape},
          {"max_rows", t.max_rows},
          {"bytes", t.bytes}};
}

}  // namespace

Json summarize_model(const std::string& path, const Json& tensors, bool plan) {
  Json j = Json::object();
  ModelHandle m;
  if (pooch_status st = pooch_model_load(path.c_str(), &m.p)) {
    const char* msg = pooch_last_error();
    j["error"] = msg && *msg ? msg : pooch_status_str(st);
    return j;
  }
  const char* family = pooch_model_family(m.p);
  j["family"] = family && *family ? family : "unknown";
  Json inputs = Json::array(), outputs = Json::array();
  pooch_tensor_info t;
  for (int i = 0; i < pooch_model_input_count(m.p); ++i)
    if (pooch_model_input_info(m.p, i, &t) == POOCH_OK) inputs.push_back(tensor_json(t));
  for (int i = 0; i < pooch_model_output_count(m.p); ++i)
    if (pooch_model_output_info(m.p, i, &t) == POOCH_OK) outputs.push_back(tensor_json(t));
  j["inputs"] = inputs;
  j["outputs"] = outputs;

  // Parameters: the elements of the weights (trainable ones, and the fixed
  // ones such as a fixed fan-in layer's input indices).
  int64_t trainable = 0, fixed = 0;
  for (const auto& x : tensors) {
    if (!x.is_object() || x.value("role", std::string()) != "weight") continue;
    int64_t n = 1;
    for (const auto& d : x.value("shape", Json::array()))
      n *= d.is_number_integer() ? d.get<int64_t>() : 0;
    (x.value("trainable", false) ? trainable : fixed) += n;
  }
  j["parameters"] = trainable;
  j["fixed_parameters"] = fixed;

  if (!plan) return j;
  pooch_session_params sp;
  pooch_session_default_params(&sp);
  sp.device = POOCH_DEVICE_CPU;
  sp.threads = 1;
  sp.resume = 0;
  SessionHandle s;
  pooch_memory_report r{};
  pooch_status st = pooch_session_create(m.p, &sp, &s.p);
  if (st == POOCH_OK) st = pooch_session_memory(s.p, &r);
  if (st != POOCH_OK) {
    const char* msg = pooch_last_error();
    j["memory_error"] = msg && *msg ? msg : pooch_status_str(st);
    return j;
  }
  j["memory"] = {{"backend", r.backend ? r.backend : ""}, {"arena_bytes", r.arena_bytes},
                 {"input_bytes", r.by_role[0]},           {"weight_bytes", r.by_role[1]},
                 {"activation_bytes", r.by_role[2]},      {"gradient_bytes", r.by_role[3]},
                 {"optimizer_bytes", r.by_role[4]}};
  return j;
}

}  // namespace cli
