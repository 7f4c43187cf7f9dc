// pooch-run import / export: checkpoints of other programs in and out of
// pooch model files. GPT-2: import reads a Hugging Face directory
// (config.json + model.safetensors) or an llm.c gpt2_*.bin; export writes a
// gpt model as a Hugging Face directory that GPT2LMHeadModel.from_pretrained
// loads. Convolutional networks: import reads a torchvision state dict saved
// as a .safetensors file (resnet, vgg); export writes one back.
#include <sys/stat.h>

#include <cstdio>
#include <memory>
#include <string_view>

#include "commands.h"

namespace cli {

namespace {

struct ImportOpts {
  std::string from, out;
  // A torchvision state dict's model: what the names and shapes leave open.
  std::string family, image_size, normalize;
  int depth = 0;
  int64_t batch = 0;
  Output output{"import"};
};

bool is_regular_file(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

// torchvision's ImageNet statistics (transforms.Normalize in its recipes).
const Json kImagenetNormalize = {{"mean", {0.485, 0.456, 0.406}}, {"std", {0.229, 0.224, 0.225}}};

int run_cnn_import(ImportOpts& o) {
  Output& out = o.output;
  Json given = Json::object();
  if (!o.family.empty()) given["family"] = o.family;
  if (o.depth > 0) given["depth"] = o.depth;
  if (o.batch > 0) given["batch"] = o.batch;
  if (!o.image_size.empty()) {
    long long h = 0, w = 0;
    char tail = 0;
    const int n = std::sscanf(o.image_size.c_str(), "%lldx%lld%c", &h, &w, &tail);
    if (!(n == 2 || (n == 1 && o.image_size.find('x') == std::string::npos)) || h <= 0 ||
        (n == 2 && w <= 0))
      return out.fail(kUsage, "--image-size " + o.image_size + ": give S or HxW (pixels)");
    given["input"] = {{"height", h}, {"width", n == 2 ? w : h}};
  }
  if (o.normalize == "imagenet")
    given["normalize"] = kImagenetNormalize;
  else if (!o.normalize.empty() && o.normalize != "none")
    return out.fail(kUsage, "--normalize " + o.normalize + ": give imagenet or none");
  char* spec = nullptr;
  if (pooch_status st =
          pooch_cnn_import(o.from.c_str(), given.dump().c_str(), o.out.c_str(), &spec))
    return out.fail(st, "import --from " + o.from);
  const Json j = Json::parse(spec, nullptr, false);
  pooch_string_free(&spec);
  std::printf("imported %s -> %s: %s-%d, %lld classes, %lldx%lldx%lld images\n", o.from.c_str(),
              o.out.c_str(), j.value("family", "?").c_str(), j.value("depth", 0),
              static_cast<long long>(j.value("classes", int64_t{0})),
              static_cast<long long>(j["input"].value("channels", int64_t{0})),
              static_cast<long long>(j["input"].value("height", int64_t{0})),
              static_cast<long long>(j["input"].value("width", int64_t{0})));
  if (!j.contains("normalize"))
    std::printf(
        "note: no image statistics recorded; images are fed as they are read (uint8 "
        "pixels scaled to [0, 1]). torchvision's ImageNet weights want --normalize "
        "imagenet\n");
  out.result()["from"] = o.from;
  out.result()["out"] = o.out;
  out.result()["model_spec"] = j;
  return kOk;
}

int run_import(ImportOpts& o) {
  Output& out = o.output;
  if (int rc = check_output_paths({{"--out", o.out}}, out)) return rc;
  const bool cnn =
      !o.family.empty() || (o.from.ends_with(".safetensors") && is_regular_file(o.from));
  if (cnn) return run_cnn_import(o);
  if (o.depth > 0 || !o.image_size.empty() || o.batch > 0 || !o.normalize.empty())
    return out.fail(kUsage,
                    "--depth, --image-size, --batch and --normalize apply to a "
                    "torchvision state dict (a .safetensors file or --family); " +
                        o.from + " is read as a GPT-2 checkpoint");
  if (pooch_status st = pooch_gpt_import(o.from.c_str(), o.out.c_str()))
    return out.fail(st, "import --from " + o.from);
  std::printf("imported %s -> %s\n", o.from.c_str(), o.out.c_str());
  out.result()["from"] = o.from;
  out.result()["out"] = o.out;
  return kOk;
}

struct ExportOpts {
  std::string model, to;
  Output output{"export"};
};

int run_export(ExportOpts& o) {
  Output& out = o.output;
  ModelHandle model;
  if (pooch_status st = pooch_model_load(o.model.c_str(), &model.p))
    return out.fail(st, "export --model " + o.model);
  const std::string family = pooch_model_family(model.p);
  if (family == "resnet" || family == "vgg") {
    if (int rc = check_output_paths({{"--to", o.to}}, out)) return rc;
    if (pooch_status st = pooch_cnn_export(o.model.c_str(), o.to.c_str()))
      return out.fail(st, "export --model " + o.model);
    std::printf("exported %s -> %s (a torchvision %s state dict)\n", o.model.c_str(), o.to.c_str(),
                family.c_str());
    out.result()["model"] = o.model;
    out.result()["to"] = o.to;
    return kOk;
  }
  if (pooch_status st = pooch_gpt_export(o.model.c_str(), o.to.c_str()))
    return out.fail(st, "export --model " + o.model);
  std::printf("exported %s -> %s/config.json, %s/model.safetensors\n", o.model.c_str(),
              o.to.c_str(), o.to.c_str());
  out.result()["model"] = o.model;
  out.result()["to"] = o.to;
  return kOk;
}

}  // namespace

Command add_import(CLI::App& app) {
  auto o = std::make_shared<ImportOpts>();
  CLI::App* c = app.add_subcommand(
      "import",
      "Read a GPT-2 checkpoint (Hugging Face directory or llm.c .bin) or a torchvision resnet "
      "or vgg state dict (.safetensors) into a model file");
  c->add_option("--from", o->from,
                "A Hugging Face directory (config.json + model.safetensors), an llm.c "
                "gpt2_*.bin, or a torchvision state dict saved as FILE.safetensors")
      ->type_name("DIR|FILE")
      ->required();
  c->add_option("--out", o->out, "The model file to write")->type_name("M.pooch")->required();
  c->add_option("--family", o->family,
                "torchvision state dicts: resnet or vgg (default: told from the names)")
      ->check(CLI::IsMember({"resnet", "vgg"}))
      ->group("torchvision state dicts");
  c->add_option("--depth", o->depth,
                "The depth (resnet 18, 34, 50, 101, 152; vgg 11, 13, 16, 19; default: counted "
                "from the names)")
      ->check(in_range(1, 1000, true))
      ->group("torchvision state dicts");
  c->add_option("--image-size", o->image_size,
                "The images' size, S or HxW pixels (default 224; a vgg's follows from its "
                "classifier)")
      ->type_name("S|HxW")
      ->group("torchvision state dicts");
  c->add_option("--batch", o->batch, "Images per step the model is planned for (default 64)")
      ->check(in_range(1, kMaxBatch, true))
      ->group("torchvision state dicts");
  c->add_option("--normalize", o->normalize,
                "imagenet: record torchvision's ImageNet mean and std, with which eval, predict "
                "and finetune normalise images; none (default): images as read")
      ->type_name("imagenet|none")
      ->group("torchvision state dicts");
  add_json_flag(c, o->output);
  return {c, [o] { return o->output.finish(run_import(*o)); }};
}

Command add_export(CLI::App& app) {
  auto o = std::make_shared<ExportOpts>();
  CLI::App* c = app.add_subcommand(
      "export",
      "Write a gpt model as a Hugging Face directory (config.json + model.safetensors), or a "
      "resnet or vgg model as a torchvision state dict (.safetensors)");
  c->add_option("--model", o->model, "The gpt, resnet or vgg model file")
      ->type_name("M.pooch")
      ->required();
  c->add_option("--to", o->to,
                "gpt: the directory to write (created if missing); resnet, vgg: the "
                ".safetensors file")
      ->type_name("DIR|FILE")
      ->required();
  add_json_flag(c, o->output);
  return {c, [o] { return o->output.finish(run_export(*o)); }};
}

}  // namespace cli
