// --machine: the shipped card descriptions parse, the reader is strict
// (every field, nothing else, no negative figure, a source for each), node
// times follow the card's roofline, and a session plans for the card (its
// memory is the budget) without taking memory here.
#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>

#include "latency_bound.h"
#include "runtime/core/error.h"
#include "runtime/core/op_registry.h"
#include "runtime/models/build.h"
#include "runtime/plan/machine.h"
#include "runtime/session/session.h"

using namespace pooch;

namespace {

std::string machines_dir() {
  return POOCH_MACHINES_DIR;
}

std::string slurp(const std::string& path) {
  std::ifstream in(path);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

// The message of the BAD_INPUT error parsing `doc` raises (empty: none).
std::string parse_error(const nlohmann::json& doc) {
  try {
    parse_machine(doc.dump(), "card.json");
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), POOCH_ERR_BAD_INPUT) << e.what();
    return e.what();
  }
  return {};
}

ModelSpec chain(int layers, int width, int batch) {
  return mlp_chain_spec(layers, width, width, 16, batch);
}

SessionConfig for_card(const std::string& file) {
  SessionConfig c;
  c.device = DeviceKind::cpu;
  c.threads = 1;
  c.machine = read_machine(machines_dir() + "/" + file);
  c.plan_only = true;
  return c;
}

}  // namespace

TEST(Machine, ShippedDescriptionsParse) {
  const std::pair<const char*, double> cards[] = {{"gtx1650.json", 4294967296.0},
                                                  {"rtx3050.json", 8589934592.0},
                                                  {"rtx4060.json", 8589934592.0},
                                                  {"h100.json", 85520809984.0},
                                                  {"h200.json", 141e9}};
  for (const auto& [file, memory] : cards) {
    const Machine m = read_machine(machines_dir() + "/" + file);
    EXPECT_FALSE(m.name.empty()) << file;
    EXPECT_EQ(m.memory, memory) << file;
    EXPECT_LT(m.usable_memory(), static_cast<size_t>(memory)) << file;
    EXPECT_GT(m.flops, 1e12) << file;
    EXPECT_GT(m.h2d_bandwidth, 1e9) << file;
  }
}

TEST(Machine, ReaderIsStrict) {
  const nlohmann::json good = nlohmann::json::parse(slurp(machines_dir() + "/gtx1650.json"));
  EXPECT_EQ(parse_error(good), "");
  auto with = [&](auto change) {
    nlohmann::json d = good;
    change(d);
    return parse_error(d);
  };
  auto has = [](const std::string& msg, const std::string& part) {
    return msg.find(part) != std::string::npos;
  };
  std::string m = with([](nlohmann::json& d) { d.erase("flops"); });
  EXPECT_TRUE(has(m, "card.json") && has(m, "missing field 'flops'")) << m;
  m = with([](nlohmann::json& d) { d["colour"] = "green"; });
  EXPECT_TRUE(has(m, "unknown field 'colour'")) << m;
  m = with([](nlohmann::json& d) { d["memory_bandwidth"] = -1; });
  EXPECT_TRUE(has(m, "field 'memory_bandwidth' is -1")) << m;
  m = with([](nlohmann::json& d) { d["flops"] = 0; });
  EXPECT_TRUE(has(m, "field 'flops' is 0")) << m;
  m = with([](nlohmann::json& d) { d["flops"] = "fast"; });
  EXPECT_TRUE(has(m, "field 'flops' must be a number")) << m;
  m = with([](nlohmann::json& d) { d["link_efficiency"] = 1.5; });
  EXPECT_TRUE(has(m, "'link_efficiency' is 1.5: a fraction is at most 1")) << m;
  m = with([](nlohmann::json& d) { d["source"].erase("link_latency"); });
  EXPECT_TRUE(has(m, "missing field 'source.link_latency'")) << m;
  m = with([](nlohmann::json& d) { d["source"]["speed"] = "fast"; });
  EXPECT_TRUE(has(m, "unknown field 'source.speed'")) << m;
  m = with([](nlohmann::json& d) { d.erase("source"); });
  EXPECT_TRUE(has(m, "missing field 'source'")) << m;
  m = with([](nlohmann::json& d) { d["reserved_memory"] = d["memory"]; });
  EXPECT_TRUE(has(m, "'reserved_memory'")) << m;
  // Zero is allowed where it means "none".
  EXPECT_EQ(with([](nlohmann::json& d) { d["link_latency"] = 0; }), "");
  try {
    parse_machine("{not json", "broken.json");
    ADD_FAILURE() << "parsed";
  } catch (const Error& e) {
    EXPECT_TRUE(has(e.what(), "broken.json: not valid JSON")) << e.what();
  }
  try {
    read_machine(machines_dir() + "/no-such-card.json");
    ADD_FAILURE() << "read";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), POOCH_ERR_IO);
    EXPECT_TRUE(has(e.what(), "no-such-card.json")) << e.what();
  }
}

TEST(Machine, NodeTimesFollowTheCardsRoofline) {
  const Machine m = read_machine(machines_dir() + "/rtx4060.json");
  const std::unique_ptr<Model> model = build_model(chain(2, 256, 2048));
  const Graph& g = model->graph;
  const Profile p = machine_profile(g, m);
  ASSERT_EQ(p.node_seconds.size(), g.nodes().size());
  EXPECT_DOUBLE_EQ(p.link.h2d_bandwidth, m.h2d_bandwidth * m.link_efficiency);
  EXPECT_DOUBLE_EQ(p.link.latency, m.link_latency);
  int compute_bound = 0;
  for (size_t i = 0; i < g.nodes().size(); ++i) {
    const Node& n = g.nodes()[i];
    const double t_c = node_flops(g, n) / (m.flops * m.compute_efficiency);
    const double t_m = node_bytes(g, n) / (m.memory_bandwidth * m.memory_efficiency);
    EXPECT_DOUBLE_EQ(p.node_seconds[i], std::max(t_c, t_m) + m.launch_overhead) << n.op;
    compute_bound += t_c > t_m;
  }
  EXPECT_GT(compute_bound, 0);  // the linears: the roofline's other side is exercised
}

// An op that reads only the rows its indices name is priced by those rows,
// not by its whole table: a bag-of-words layer ten times wider costs the same
// per step, and so does its row-sparse update (on the card and on the host).
TEST(Machine, RowReadersArePricedByTheRowsTheirIndicesName) {
  const Machine m = read_machine(machines_dir() + "/rtx3050.json");
  auto times = [&](int64_t width) {
    ModelSpec s = spec_from_flags(InputKind::sparse, width, 300, 64, 0, 8, LossKind::bce, 0);
    s.run.batch = 32;  // at most 32 * 64 nonzeros: 2048 rows of the input layer
    const Session session(build_model(s), for_card("rtx3050.json"));  // the train step's graph
    const Graph& g = session.graph();
    const Profile p = machine_profile(g, m);
    std::map<std::string, std::pair<double, double>> t;  // op: device, host seconds
    for (size_t i = 0; i < g.nodes().size(); ++i) {
      const Node& n = g.nodes()[i];
      if (n.op != "sparse_linear" && n.op != "adam_update_rows") continue;
      const NodeOperands o = node_operands(g, n);
      EXPECT_LT(node_bytes(g, n), op_bytes(o.in, o.out) / 10) << n.op << " at width " << width;
      t[n.op] = {p.node_seconds[i], p.host_node_seconds[i]};
    }
    return t;
  };
  const auto narrow = times(100000), wide = times(1000000);
  ASSERT_EQ(narrow.size(), 2u);
  EXPECT_EQ(narrow, wide);

  // The embedding's gather: the ids' rows of the table.
  const TensorDesc ids{"ids", DType::i32, {4, 8}, Role::input};
  const TensorDesc table{"wte", DType::f32, {50000, 16}, Role::weight};
  const TensorDesc out{"x", DType::f32, {4, 8, 16}, Role::activation};
  const std::vector<const TensorDesc*> in{&ids, &table}, outs{&out};
  EXPECT_DOUBLE_EQ(op_bytes(op_registry().get("embedding"), in, outs, {}),
                   double(ids.bytes() + 32 * 16 * 4 + out.bytes()));
}

TEST(Machine, InputsAnOpWritesArePricedReadAndWritten) {
  // Adam reads w, g, m, v and writes w, m, v: 7 floats an element.
  const TensorDesc w{"w", DType::f32, {64, 32}, Role::weight};
  const TensorDesc g{"g", DType::f32, {64, 32}, Role::gradient};
  const TensorDesc m{"m", DType::f32, {64, 32}, Role::optimizer_state};
  const TensorDesc v{"v", DType::f32, {64, 32}, Role::optimizer_state};
  const std::vector<const TensorDesc*> adam{&w, &g, &m, &v}, none;
  EXPECT_DOUBLE_EQ(op_bytes(op_registry().get("adam_update"), adam, none, {}),
                   7.0 * double(w.bytes()));

  // A decoding step reads its layer's cache but writes one position of it.
  const TensorDesc qkv{"qkv", DType::f32, {2, 1, 48}, Role::activation};
  const TensorDesc cache{"cache", DType::f32, {2, 100, 32}, Role::weight};
  const TensorDesc pos{"pos", DType::i32, {2, 1}, Role::input};
  const TensorDesc att{"att", DType::f32, {2, 1, 16}, Role::activation};
  const std::vector<const TensorDesc*> in{&qkv, &cache, &pos}, out{&att};
  EXPECT_DOUBLE_EQ(op_bytes(op_registry().get("attention_decode"), in, out, {}),
                   op_bytes(in, out) + 2 * 32 * 4);
}

TEST(Machine, SessionPlansForTheCardWithoutTakingMemory) {
  // 24 layers of 2048 at batch 8192: ~3.2 GB of saved activations and 1.2 GB
  // of weights with Adam's state; no GTX 1650 holds it in core, an H200 does.
  const ModelSpec spec = chain(24, 2048, 8192);
  Session small(build_model(spec), for_card("gtx1650.json"));
  const Machine& m = *small.machine();
  EXPECT_EQ(small.budget(), m.usable_memory());
  const OutOfCoreReport& r = small.out_of_core();
  EXPECT_TRUE(r.active);
  EXPECT_GT(r.in_core_arena, m.usable_memory());
  EXPECT_LE(small.memory_plan().peak, m.usable_memory());
  EXPECT_LE(small.arena_taken(), m.usable_memory());
  EXPECT_GT(r.swapped_bytes + r.recomputed_bytes, 0u);
  EXPECT_GE(r.predicted_seconds, r.predicted_in_core);  // copies hide behind 38 ms linears
  EXPECT_TRUE(small.plan_only());
  try {
    small.run(ProgramKind::train_step);
    ADD_FAILURE() << "a plan-only session ran";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), POOCH_ERR_UNSUPPORTED);
  }

  Session big(build_model(spec), for_card("h200.json"));
  EXPECT_FALSE(big.out_of_core().active);
  // The same step in core: the H200's roofline is faster than the 1650's.
  EXPECT_LT(big.out_of_core().predicted_in_core, r.predicted_in_core / 5);

  // An explicit budget wins over the card's memory.
  SessionConfig capped = for_card("h200.json");
  capped.device_memory = small.budget();
  Session h200_capped(build_model(spec), capped);
  EXPECT_EQ(h200_capped.budget(), small.budget());
  EXPECT_TRUE(h200_capped.out_of_core().active);
}

// On a GTX 1650, ResNet-50 (64 px, batch 8) at 284 MiB: pooch-greedy swaps
// batch normalisation statistics, each copy mostly the link's 10 us
// latency, and the arena is too full to keep them as they are; auto keeps
// every one, recomputing one kept activation to make room, and predicts a
// faster step than pooch-greedy.
TEST(Machine, AutoMakesRoomToKeepLatencyBoundActivations) {
  SessionConfig c = for_card("gtx1650.json");
  c.device_memory = size_t{284} << 20;
  const ModelSpec spec = spec_from_json(
      R"({"family": "resnet", "depth": 50, "classes": 10, "batch": 8,
          "input": {"channels": 3, "height": 64, "width": 64}})",
      "resnet50");
  struct Plan {
    int latency_bound_swaps = 0;
    double seconds = 0;
  };
  auto plan = [&](Strategy st) {
    c.strategy = st;
    Session s(build_model(spec), c);
    EXPECT_TRUE(s.out_of_core().active);
    return Plan{latency_bound_swaps(s), s.out_of_core().predicted_seconds};
  };
  const Plan greedy = plan(Strategy::pooch_greedy);
  const Plan best = plan(Strategy::automatic);
  std::printf("latency-bound swaps: pooch-greedy %d (%.5f s), auto %d (%.5f s)\n",
              greedy.latency_bound_swaps, greedy.seconds, best.latency_bound_swaps, best.seconds);
  ASSERT_GT(greedy.latency_bound_swaps, 0);
  EXPECT_EQ(best.latency_bound_swaps, 0);
  EXPECT_LT(best.seconds, greedy.seconds);
}
