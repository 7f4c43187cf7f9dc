// pooch-run synth: a synthetic train/test pair shaped like a known data set,
// written as DIR/train.txt and DIR/test.txt (bag of words).
#include <cstdio>
#include <filesystem>
#include <memory>

#include "commands.h"
#include "data_args.h"
#include "dense.h"

namespace cli {

namespace {

struct SynthOpts {
  std::string preset = "EURLex-4K";
  double scale = 1;
  uint64_t seed = 1;
  std::string out;
  std::string kind = "xmc";
  DenseSynthFlags dense;
  const CLI::App* app = nullptr;
  Output output{"synth"};
};

int run_synth(SynthOpts& o) {
  Output& out = o.output;
  // Flags of the other kind would be ignored: refuse them.
  const bool dense = o.kind != "xmc";
  for (const char* flag : {"--preset", "--scale", "--rows", "--features", "--outputs", "--noise"}) {
    const bool dense_flag = std::string(flag) != "--preset" && std::string(flag) != "--scale";
    if (dense_flag != dense && o.app->count(flag) > 0)
      return out.fail(kUsage, std::string(flag) + ": applies to --kind " +
                                  (dense_flag ? "regression or classification" : "xmc") +
                                  ", not to --kind " + o.kind);
  }
  if (dense) {
    o.dense.kind = o.kind;
    return run_dense_synth(o.dense, o.seed, o.out, out);
  }
  const auto t0 = std::chrono::steady_clock::now();
  DatasetHandle train, test;
  if (pooch_status st =
          pooch_dataset_create_synth(o.preset.c_str(), o.scale, o.seed, &train.p, &test.p))
    return out.fail(st, "generating the data set");
  std::error_code ec;
  std::filesystem::create_directories(o.out, ec);
  if (ec) return out.fail(kBadInput, "synth: cannot create '" + o.out + "': " + ec.message());
  const std::string train_path = (std::filesystem::path(o.out) / "train.txt").string();
  const std::string test_path = (std::filesystem::path(o.out) / "test.txt").string();
  if (pooch_status st = pooch_dataset_save(train.p, train_path.c_str()))
    return out.fail(st, "writing " + train_path);
  if (pooch_status st = pooch_dataset_save(test.p, test_path.c_str()))
    return out.fail(st, "writing " + test_path);
  for (auto [label, ds, path] :
       {std::tuple{"train", train.p, train_path}, std::tuple{"test", test.p, test_path}}) {
    const Shape s = shape_of(ds);
    std::printf("%s: %s: %lld rows, %lld features, %lld labels\n", label, path.c_str(),
                static_cast<long long>(s.rows), static_cast<long long>(s.features),
                static_cast<long long>(s.labels));
    out.result()[label] = shape_json(ds, path);
  }
  const double secs = seconds_since(t0);
  std::printf("synth %s at scale %g (seed %llu) in %.2f s\n", o.preset.c_str(), o.scale,
              static_cast<unsigned long long>(o.seed), secs);
  out.result()["preset"] = o.preset;
  out.result()["scale"] = o.scale;
  out.result()["seed"] = o.seed;
  out.result()["seconds"] = secs;
  return kOk;
}

}  // namespace

Command add_synth(CLI::App& app) {
  auto o = std::make_shared<SynthOpts>();
  CLI::App* c =
      app.add_subcommand("synth",
                         "Write a synthetic train/test pair shaped like a known data set, or a "
                         "dense regression or classification set (--kind)");
  c->add_option("--preset", o->preset,
                list_names(synth_preset_names()) + " (any case; the start of a name will do)")
      ->transform(one_of(synth_preset_names(), true))
      ->capture_default_str();
  c->add_option("--scale", o->scale, "Rows and labels relative to the real data set")
      ->check(in_range(0, kMaxScale, false, true))
      ->capture_default_str();
  c->add_option("--seed", o->seed, "Seed (the same seed gives the same bytes)")
      ->check(seed_range())
      ->capture_default_str();
  c->add_option("--kind", o->kind,
                "xmc: a bag-of-words pair (train.txt, test.txt) shaped by --preset; regression "
                "or classification: dense X.npy and Y.npy")
      ->check(CLI::IsMember({"xmc", "regression", "classification"}))
      ->capture_default_str();
  c->add_option("--rows", o->dense.rows, "Dense kinds: rows")
      ->check(positive())
      ->capture_default_str()
      ->group("Dense kinds");
  c->add_option("--features", o->dense.features, "Dense kinds: features per row")
      ->check(positive())
      ->capture_default_str()
      ->group("Dense kinds");
  c->add_option("--outputs", o->dense.outputs,
                "Dense kinds: targets per row (regression, default 2) or classes "
                "(classification, default 4)")
      ->check(positive())
      ->group("Dense kinds");
  c->add_option("--noise", o->dense.noise, "Dense kinds: standard deviation of the noise")
      ->check(non_negative())
      ->capture_default_str()
      ->group("Dense kinds");
  c->add_option("--out", o->out,
                "Directory for train.txt and test.txt (dense kinds: X.npy and Y.npy)")
      ->type_name("DIR")
      ->required();
  add_json_flag(c, o->output);
  o->app = c;
  return {c, [o] { return o->output.finish(run_synth(*o)); }};
}

}  // namespace cli
