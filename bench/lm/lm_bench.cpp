// bench/lm: training and generation throughput of a GPT-2-shaped model
// (random weights) on one backend, for bench/lm/run.py to set beside the
// PyTorch peer (bench/peers/lm_torch.py) run with the same shapes and
// threads. Prints one JSON object:
//   train_step_s      median seconds per training step after the first
//   train_tokens_s    batch·ctx / train_step_s
//   gen_tokens_s      new tokens per second of greedy generation (batch 1,
//                     KV cache), after a prompt of --prompt tokens
//   gen_setup_s       seconds to set up the decoder and copy the weights
//                     into it (as pooch_generate's first call does)
//   peak_rss_mib      the process's peak resident memory
//   arena_mib         the training session's device arena
//
//   pooch-bench-lm [--layers 12] [--heads 12] [--width 768] [--vocab 50257]
//                  [--ctx 256] [--batch 1] [--steps 3] [--threads 2]
//                  [--gen-tokens 32] [--prompt 16] [--device cpu|cuda]
//                  [--profile 1]
//
// --profile 1: also one profiled train step, its time per op kind on stderr
// (where the step goes).
#include <fmt/format.h>
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "runtime/core/error.h"
#include "runtime/models/gpt.h"
#include "runtime/session/session.h"
#include "runtime/train/generate.h"

using namespace pooch;

namespace {

double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

double peak_rss_mib() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_maxrss) / 1024.0;
}

}  // namespace

int main(int argc, char** argv) {
  GptSpec g = gpt_size("gpt2");
  int64_t ctx = 256, batch = 1, steps = 3, gen_tokens = 32, prompt = 16;
  int threads = 2;
  bool profile = false;
  DeviceKind device = DeviceKind::cpu;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i];
    const char* v = argv[i + 1];
    const int64_t n = std::atoll(v);
    if (k == "--layers")
      g.n_layer = n;
    else if (k == "--heads")
      g.n_head = n;
    else if (k == "--width")
      g.n_embd = n;
    else if (k == "--vocab")
      g.vocab_size = n;
    else if (k == "--ctx")
      ctx = n;
    else if (k == "--batch")
      batch = n;
    else if (k == "--steps")
      steps = n;
    else if (k == "--threads")
      threads = static_cast<int>(n);
    else if (k == "--gen-tokens")
      gen_tokens = n;
    else if (k == "--prompt")
      prompt = n;
    else if (k == "--profile")
      profile = n != 0;
    else if (k == "--device")
      device = std::strcmp(v, "cuda") == 0 ? DeviceKind::cuda : DeviceKind::cpu;
    else {
      std::fprintf(stderr, "pooch-bench-lm: unknown flag %s\n", k.c_str());
      return 2;
    }
  }
  g.n_ctx = std::max<int64_t>(ctx, prompt + gen_tokens);
  try {
    SessionConfig cfg;
    cfg.device = device;
    cfg.threads = threads;
    cfg.optimizer.kind = OptimizerConfig::Kind::adamw;
    cfg.optimizer.lr = 1e-4;
    cfg.optimizer.weight_decay = 0.1;
    cfg.optimizer.decay_vectors = false;
    const ModelSpec spec = gpt_spec(g, batch, ctx, 1);
    Session s(std::shared_ptr<Model>(build_gpt_model(spec)), cfg);
    std::vector<int32_t> tokens(static_cast<size_t>(batch * ctx)), targets(tokens.size());
    for (size_t i = 0; i < tokens.size(); ++i) {
      tokens[i] = static_cast<int32_t>((i * 7919) % static_cast<size_t>(g.vocab_size));
      targets[i] = static_cast<int32_t>(((i + 1) * 7919) % static_cast<size_t>(g.vocab_size));
    }
    s.set_input("batch.tokens", tokens.data(), tokens.size() * 4);
    s.set_input("batch.targets", targets.data(), targets.size() * 4);
    std::vector<double> times;
    for (int64_t i = 0; i < steps; ++i) {
      const double t0 = now();
      s.run(ProgramKind::train_step);
      float loss;
      s.get_output("loss", &loss, 4);  // waits for the step
      times.push_back(now() - t0);
    }
    std::vector<double> warm(times.begin() + (times.size() > 1 ? 1 : 0), times.end());
    std::sort(warm.begin(), warm.end());
    const double step_s = warm[warm.size() / 2];
    if (profile) {
      s.run_profiled_train_step();
      std::map<std::string, double> by_op;
      double total = 0;
      const auto& nodes = s.graph().nodes();
      for (size_t i = 0; i < nodes.size(); ++i) {
        by_op[nodes[i].op] += s.profile().node_seconds[i];
        total += s.profile().node_seconds[i];
      }
      std::vector<std::pair<double, std::string>> rows;
      for (const auto& [op, t] : by_op) rows.emplace_back(t, op);
      std::sort(rows.rbegin(), rows.rend());
      std::fprintf(stderr, "one profiled train step: %.3f s in kernels\n", total);
      for (const auto& [t, op] : rows)
        if (t > 0.002 * total)
          std::fprintf(stderr, "  %-28s %8.1f ms %5.1f%%\n", op.c_str(), t * 1e3, 100 * t / total);
    }

    // The decoder as pooch_generate sets it up: no initialisers (every
    // weight is copied from the training session at once).
    const double t_setup = now();
    SessionConfig decoder = cfg;
    decoder.initialise = false;
    Generator gen(spec, decoder);
    gen.copy_weights(s);
    const double setup_s = now() - t_setup;
    std::vector<int32_t> p(static_cast<size_t>(prompt));
    for (size_t i = 0; i < p.size(); ++i) p[i] = static_cast<int32_t>(i * 31 % g.vocab_size);
    SamplingConfig sc;
    sc.temperature = 0;
    sc.max_tokens = gen_tokens;
    // Timed from the first new token: the prompt's steps are the same work.
    double t_first = 0;
    const std::vector<int32_t> out = gen.generate(p, sc, [&](int32_t, int64_t i) {
      if (i == 0) t_first = now();
      return true;
    });
    const double gen_s = now() - t_first;
    std::printf(
        "{\"train_step_s\": %.4f, \"train_tokens_s\": %.1f, \"gen_tokens_s\": %.2f, "
        "\"gen_setup_s\": %.3f, \"peak_rss_mib\": %.1f, \"arena_mib\": %.1f, "
        "\"backend\": \"%s\"}\n",
        step_s, static_cast<double>(batch * ctx) / step_s,
        static_cast<double>(out.size() - 1) / gen_s, setup_s, peak_rss_mib(),
        static_cast<double>(s.memory_plan().peak) / (1 << 20), s.backend_name());
  } catch (const Error& e) {
    std::fprintf(stderr, "pooch-bench-lm: %s\n", e.what());
    return 1;
  }
  return 0;
}
