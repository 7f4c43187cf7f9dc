// pooch-run info: everything in a .pooch file (model or checkpoint), aligned
// for reading: the file, its metadata, the model spec, the graph's ops and
// the tensor table (from pooch_file_describe's JSON).
#include <algorithm>
#include <cstdio>
#include <map>
#include <memory>

#include "commands.h"
#include "model_info.h"

namespace cli {

namespace {

struct InfoOpts {
  std::string path;
  bool no_ops = false;
  bool no_plan = false;
  Output output{"info"};
};

std::string str(const Json& v) {
  if (v.is_string()) return v.get<std::string>();
  if (v.is_null()) return "-";
  if (v.is_number_float()) {  // float32 values stored as doubles: 6 digits say it all
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.6g", v.get<double>());
    return buf;
  }
  if (v.is_array()) {
    std::string s = "[";
    for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + str(v[i]);
    return s + "]";
  }
  if (v.is_object()) {
    std::string s = "{";
    for (auto it = v.begin(); it != v.end(); ++it)
      s += (it == v.begin() ? "" : ", ") + it.key() + ": " + str(it.value());
    return s + "}";
  }
  return v.dump();
}

std::string shape_str(const Json& shape) {
  if (!shape.is_array()) return str(shape);
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? "×" : "") + str(shape[i]);
  return s + "]";
}

void print_spec(const Json& spec) {
  std::printf("\nmodel spec\n");
  std::vector<std::vector<std::string>> rows;
  if (spec.contains("family")) rows.push_back({"family", str(spec["family"])});
  if (spec.contains("input") && spec["input"].is_object() && spec["input"].contains("channels"))
    // A convolutional family's images: C x H x W.
    rows.push_back({"input", str(spec["input"]["channels"]) + "x" +
                                 str(spec["input"].value("height", Json(0))) + "x" +
                                 str(spec["input"].value("width", Json(0))) + " images"});
  else if (spec.contains("input") && spec["input"].is_object())
    rows.push_back({"input", str(spec["input"].value("kind", Json("sparse"))) + ", " +
                                 str(spec["input"].value("width", Json(0))) + " features"});
  if (spec.contains("labels")) rows.push_back({"labels", str(spec["labels"])});
  for (const char* k : {"depth", "classes", "width", "stem", "batchnorm", "hidden", "dropout"})
    if (spec.contains(k)) rows.push_back({k, str(spec[k])});
  if (spec.contains("layers") && spec["layers"].is_array()) {
    for (size_t i = 0; i < spec["layers"].size(); ++i) {
      const Json& l = spec["layers"][i];
      const std::string type = str(l.value("type", Json("?")));
      std::string d = type;
      if (type == "linear")
        d += " " + str(l.value("width", Json(0))) + ", " + str(l.value("activation", Json("relu")));
      else if (type == "dropout")
        d += " p=" + str(l.value("p", Json(0)));
      else if (type == "ffi")
        d += " (fixed fan-in " + str(l.value("fan_in", Json(0))) + ")";
      rows.push_back({i == 0 ? "layers" : "", std::to_string(i) + ": " + d});
    }
  }
  if (spec.contains("outputs")) rows.push_back({"outputs", str(spec["outputs"])});
  for (const char* k : {"loss", "batch", "max_nnz", "topk", "seed"})
    if (spec.contains(k)) rows.push_back({k, str(spec[k])});
  print_table(rows, {});
}

std::string attrs_str(const Json& attrs) {
  if (!attrs.is_object() || attrs.empty()) return "";
  std::string s;
  for (auto& [k, v] : attrs.items()) s += (s.empty() ? "" : " ") + k + "=" + str(v);
  return s;
}

std::string join(const Json& a) {
  std::string s;
  if (!a.is_array()) return s;
  for (const auto& x : a) s += (s.empty() ? "" : ", ") + str(x);
  return s;
}

// The model as a program sees it (model_info.h): family, parameters, the
// named inputs and outputs, the arena plan.
void print_summary(const Json& m) {
  if (m.contains("error")) {
    std::printf("\nmodel: cannot load it: %s\n", str(m["error"]).c_str());
    return;
  }
  std::printf("\nmodel: %s, %s parameters", str(m["family"]).c_str(), str(m["parameters"]).c_str());
  if (m.value("fixed_parameters", 0) > 0)
    std::printf(" (and %s fixed)", str(m["fixed_parameters"]).c_str());
  std::printf("\n");
  for (const char* kind : {"inputs", "outputs"}) {
    std::vector<std::vector<std::string>> rows;
    for (const auto& t : m.value(kind, Json::array())) {
      std::string shape = "[";
      const Json dims = t.value("shape", Json::array());
      for (size_t i = 0; i < dims.size(); ++i)
        shape +=
            (i ? "×" : "") + (dims[i].get<int64_t>() < 0 ? std::string("batch") : str(dims[i]));
      shape += "]";
      const int64_t batch = t.value("max_rows", int64_t{0});
      rows.push_back({str(t["name"]), str(t["dtype"]), shape,
                      batch > 0 ? "batch " + std::to_string(batch) : "",
                      format_bytes(t.value("bytes", 0.0))});
    }
    std::printf("  %s\n", kind);
    print_table(rows, {false, false, false, false, true}, "    ");
  }
  if (m.contains("memory")) {
    const Json& r = m["memory"];
    std::printf(
        "  plan of a training step on the %s backend: arena %s (inputs %s, weights %s, "
        "activations %s, gradients %s, optimizer %s)\n",
        str(r["backend"]).c_str(), format_bytes(r.value("arena_bytes", 0.0)).c_str(),
        format_bytes(r.value("input_bytes", 0.0)).c_str(),
        format_bytes(r.value("weight_bytes", 0.0)).c_str(),
        format_bytes(r.value("activation_bytes", 0.0)).c_str(),
        format_bytes(r.value("gradient_bytes", 0.0)).c_str(),
        format_bytes(r.value("optimizer_bytes", 0.0)).c_str());
  } else if (m.contains("memory_error")) {
    std::printf("  plan: not available: %s\n", str(m["memory_error"]).c_str());
  }
}

int run_info(InfoOpts& o) {
  Output& out = o.output;
  char* text = nullptr;
  if (pooch_status st = pooch_file_describe(o.path.c_str(), &text)) return out.fail(st, "info");
  Json doc = Json::parse(text ? text : "", nullptr, false);
  pooch_string_free(&text);
  if (!doc.is_object()) return out.fail(kInternal, o.path + ": the file description is not JSON");

  const Json meta = doc.value("metadata", Json::object());
  const Json tensors = doc.value("tensors", Json::array());
  const Json nodes = doc.value("nodes", Json::array());
  std::string kind = meta.contains("pooch.kind") ? str(meta["pooch.kind"]) : "?";

  // File.
  std::printf("%s\n", o.path.c_str());
  print_table({{"kind", kind},
               {"format", "version " + str(doc.value("format_version", Json(0)))},
               {"size", format_bytes(doc.value("file_bytes", 0.0)) + " (" +
                            str(doc.value("file_bytes", Json(0))) + " bytes)"}},
              {});

  // Metadata (the spec below, parsed).
  Json spec;
  std::printf("\nmetadata (%zu entries)\n", meta.size());
  std::vector<std::vector<std::string>> mrows;
  for (auto& [k, v] : meta.items()) {
    if (k == "model.spec" && v.is_string()) {
      spec = Json::parse(v.get<std::string>(), nullptr, false);
      mrows.push_back({k, spec.is_discarded() ? str(v) : "(model spec, below)"});
      continue;
    }
    std::string s = str(v);
    if (v.is_string()) {  // compact JSON held in a string
      const Json inner = Json::parse(s, nullptr, false);
      if (inner.is_object() || inner.is_array()) s = str(inner);
    }
    mrows.push_back({k, s});
  }
  print_table(mrows, {});
  if (spec.is_object()) print_spec(spec);
  Json summary = summarize_model(o.path, tensors, !o.no_plan);
  print_summary(summary);

  // Graph.
  std::map<std::string, int> op_counts;
  for (const auto& n : nodes) ++op_counts[str(n.value("op", Json("?")))];
  std::printf("\ngraph: %zu ops", nodes.size());
  std::string counts;
  for (auto& [op, c] : op_counts)
    counts += (counts.empty() ? "" : ", ") + op + " " + std::to_string(c);
  std::printf(" (%s)\n", counts.c_str());
  if (!o.no_ops) {
    std::vector<std::vector<std::string>> rows{{"#", "op", "inputs", "outputs", "attributes"}};
    for (size_t i = 0; i < nodes.size(); ++i) {
      const Json& n = nodes[i];
      rows.push_back({std::to_string(i), str(n.value("op", Json("?"))),
                      join(n.value("inputs", Json::array())),
                      "-> " + join(n.value("outputs", Json::array())),
                      attrs_str(n.value("attrs", Json::object()))});
    }
    print_table(rows, {true});
  }

  // Tensor table: the stored tensors, then a summary of the others.
  std::vector<std::vector<std::string>> rows{
      {"name", "dtype", "shape", "role", "size", "offset", "xxh3"}};
  std::map<std::string, std::pair<int64_t, double>> by_role, unstored;
  double stored_bytes = 0;
  for (const auto& t : tensors) {
    const std::string role = str(t.value("role", Json("?")));
    const double bytes = t.value("bytes", 0.0);
    if (!t.contains("offset")) {
      auto& u = unstored[role];
      ++u.first;
      u.second += bytes;
      continue;
    }
    auto& r = by_role[role];
    ++r.first;
    r.second += bytes;
    stored_bytes += bytes;
    rows.push_back({str(t.value("name", Json("?"))), str(t.value("dtype", Json("?"))),
                    shape_str(t.value("shape", Json::array())), role, format_bytes(bytes),
                    str(t["offset"]), str(t.value("xxh3", Json("-")))});
  }
  std::printf("\ntensors: %zu stored, %s\n", rows.size() - 1, format_bytes(stored_bytes).c_str());
  print_table(rows, {false, false, false, false, true, true, false});
  std::string roles;
  for (auto& [role, r] : by_role)
    roles += (roles.empty() ? "" : ", ") + role + " " + std::to_string(r.first) + " (" +
             format_bytes(r.second) + ")";
  if (!roles.empty()) std::printf("  by role: %s\n", roles.c_str());
  if (!unstored.empty()) {
    std::string u;
    for (auto& [role, r] : unstored)
      u += (u.empty() ? "" : ", ") + role + " " + std::to_string(r.first) + " (" +
           format_bytes(r.second) + ")";
    std::printf("  in the graph, not stored: %s\n", u.c_str());
  }

  out.result()["model"] = std::move(summary);
  out.result()["file"] = std::move(doc);
  // predict and eval refuse a model whose spec cannot be read; so does info.
  if (meta.contains("model.spec") && !spec.is_object())
    return out.fail(kBadInput, o.path +
                                   ": the model spec stored in metadata 'model.spec' is not a "
                                   "JSON object; the file is damaged or was not written by pooch");
  return kOk;
}

}  // namespace

Command add_info(CLI::App& app) {
  auto o = std::make_shared<InfoOpts>();
  CLI::App* c = app.add_subcommand(
      "info", "Show everything in a .pooch file: metadata, spec, graph ops, tensor table");
  c->add_option("file", o->path, "Model or checkpoint")->type_name("FILE.pooch")->required();
  c->add_flag("--no-ops", o->no_ops, "Leave out the list of graph ops");
  c->add_flag("--no-plan", o->no_plan,
              "Leave out the arena plan (it creates a CPU session, whose arena takes host memory)");
  add_json_flag(c, o->output);
  return {c, [o] { return o->output.finish(run_info(*o)); }};
}

}  // namespace cli
