// The .pooch container: round trips, every reader error (each made by
// corrupting a valid file at the byte the spec names), atomic writes and a
// small fuzz loop. The layout helpers here follow docs/FORMAT.md, not the
// implementation, so the tests check the spec as written.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <random>

#include "formats/pooch_file.h"
#include "runtime/core/autodiff.h"
#include "runtime/core/error.h"
#include "runtime/core/op_registry.h"

using namespace pooch;
namespace fs = std::filesystem;
using Bytes = std::vector<unsigned char>;

namespace {

// Header field offsets (docs/FORMAT.md "Header").
constexpr size_t kVersion = 8, kFlags = 12, kFileSize = 16, kMetaOff = 24, kMetaSize = 32,
                 kGraphOff = 40, kGraphSize = 48, kTableOff = 56, kTableSize = 64, kDataOff = 72,
                 kDataSize = 80, kMetaSum = 88, kGraphSum = 96, kTableSum = 104, kHeaderSum = 120;

uint64_t rd64(const Bytes& b, size_t at) {
  uint64_t v;
  std::memcpy(&v, b.data() + at, 8);
  return v;
}
uint32_t rd32(const Bytes& b, size_t at) {
  uint32_t v;
  std::memcpy(&v, b.data() + at, 4);
  return v;
}
void wr64(Bytes& b, size_t at, uint64_t v) {
  std::memcpy(b.data() + at, &v, 8);
}
void wr32(Bytes& b, size_t at, uint32_t v) {
  std::memcpy(b.data() + at, &v, 4);
}
void wr16(Bytes& b, size_t at, uint16_t v) {
  std::memcpy(b.data() + at, &v, 2);
}
void wrf64(Bytes& b, size_t at, double v) {
  std::memcpy(b.data() + at, &v, 8);
}

// Recomputes the section and header checksums after an edit, so that the
// edit reaches the parser instead of stopping at a checksum.
void reseal(Bytes& b) {
  if (b.size() < 128) return;
  auto sum = [&](size_t off_field, size_t size_field, size_t sum_field) {
    const uint64_t off = rd64(b, off_field), size = rd64(b, size_field);
    if (off <= b.size() && size <= b.size() - off) wr64(b, sum_field, XXH3_64bits(&b[off], size));
  };
  sum(kMetaOff, kMetaSize, kMetaSum);
  sum(kGraphOff, kGraphSize, kGraphSum);
  sum(kTableOff, kTableSize, kTableSum);
  wr64(b, kHeaderSum, XXH3_64bits(b.data(), 120));
}

// The offset of the first length-prefixed string `s` in [from, to).
size_t find_str(const Bytes& b, size_t from, size_t to, std::string_view s) {
  const auto len = static_cast<uint32_t>(s.size());
  Bytes needle = {static_cast<unsigned char>(len), static_cast<unsigned char>(len >> 8),
                  static_cast<unsigned char>(len >> 16), static_cast<unsigned char>(len >> 24)};
  needle.insert(needle.end(), s.begin(), s.end());
  auto it = std::search(b.begin() + static_cast<ptrdiff_t>(from),
                        b.begin() + static_cast<ptrdiff_t>(to), needle.begin(), needle.end());
  if (it == b.begin() + static_cast<ptrdiff_t>(to))
    throw std::runtime_error("not found: " + std::string(s));
  return static_cast<size_t>(it - b.begin());
}

Bytes slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return Bytes(std::istreambuf_iterator<char>(in), {});
}

void spit(const std::string& path, const Bytes& b) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(b.data()), static_cast<std::streamsize>(b.size()));
}

std::vector<std::string> temp_files_in(const std::string& dir) {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.path().filename().string().find(".tmp-") != std::string::npos)
      out.push_back(e.path().string());
  return out;
}

// A graph from real ops: linear → relu → linear → bce_logits, its backward
// pass and Adam updates (so optimizer state and zero-output nodes), plus a
// u16 index, an empty tensor and a sparse_rows link.
struct Model {
  Graph g;
  std::vector<TensorId> carried;  // tensors whose data the file holds
  std::vector<std::vector<unsigned char>> data;
  Metadata meta;

  std::vector<TensorData> tensor_data() const {
    std::vector<TensorData> out;
    for (size_t i = 0; i < carried.size(); ++i)
      out.push_back({carried[i], data[i].data(), data[i].size(), {}});
    return out;
  }
};

Model make_model() {
  Model m;
  Graph& g = m.g;
  const TensorId x = g.add_tensor({"x", DType::f32, {4, 32}, Role::input});
  const TensorId y = g.add_tensor({"targets", DType::f32, {4, 3}, Role::input});
  auto weight = [&](std::string name, Shape shape) {
    TensorDesc d{std::move(name), DType::f32, std::move(shape), Role::weight};
    d.trainable = true;
    return g.add_tensor(std::move(d));
  };
  const TensorId w1 = weight("w1", {64, 32});
  const TensorId b1 = weight("b1", {64});
  const TensorId w2 = weight("w2", {3, 64});
  const TensorId b2 = weight("b2", {3});
  const TensorId h = g.add_op1("linear", {x, w1, b1}, {}, "hidden.pre");
  const TensorId a = g.add_op1("relu", {h}, {}, "hidden.act");
  const TensorId logits = g.add_op1("linear", {a, w2, b2}, {}, "logits");
  const TensorId loss = g.add_op1("bce_logits", {logits, y}, {}, "loss");
  g.mark_output(loss);
  g.mark_output(logits);
  const auto grads = build_backward(g, loss);
  std::vector<TensorId> weights;
  for (const WeightGrad& wg : grads) {
    const TensorDesc wd = g.tensor(wg.weight);
    const TensorId mm = g.add_tensor({wd.name + ".m", wd.dtype, wd.shape, Role::optimizer_state});
    const TensorId vv = g.add_tensor({wd.name + ".v", wd.dtype, wd.shape, Role::optimizer_state});
    g.add_op("adam_update", {wg.weight, wg.grad, mm, vv},
             Attrs{{"lr", 1e-3},
                   {"beta1", 0.9},
                   {"beta2", 0.999},
                   {"eps", 1e-8},
                   {"weight_decay", 0.0},
                   {"decoupled", 0.0}});
    weights.push_back(wg.weight);
  }
  const TensorId index = g.add_tensor({"head.index", DType::u16, {3, 5}, Role::weight});
  const TensorId empty = g.add_tensor({"empty", DType::i32, {0, 7}, Role::weight});
  const TensorId rows = g.add_tensor({"rows", DType::i32, {9}, Role::gradient});
  const TensorId rg = g.add_tensor({"row.grad", DType::f32, {8, 32}, Role::gradient});
  g.tensor(rg).sparse_rows = rows;

  m.carried = {w1, b1, w2, b2, index, empty};
  for (const TensorDesc& t : g.tensors())
    if (t.role == Role::optimizer_state) m.carried.push_back(*g.find(t.name));
  std::mt19937_64 rng(7);
  for (TensorId id : m.carried) {
    std::vector<unsigned char> d(g.tensor(id).bytes());
    for (auto& c : d) c = static_cast<unsigned char>(rng());
    m.data.push_back(std::move(d));
  }

  Metadata& md = m.meta;
  md.set_string(meta_keys::kKind, "checkpoint");
  md.set_u64(meta_keys::kStep, 12345);
  md.set_u64(meta_keys::kEpoch, 3);
  md.set_u64(meta_keys::kRngSeed, 42);
  md.set_u64_array(meta_keys::kRngState, {1, 2, 0xFFFFFFFFFFFFFFFFull});
  md.set_u64(meta_keys::kDataSeed, 99);
  md.set_u64(meta_keys::kDataPosition, 4096);
  md.set_f64(meta_keys::kLr, 5e-4);
  md.set_string(meta_keys::kLrSchedule, "plateau");
  md.set_f64_array(meta_keys::kLrScheduleState, {0.4231, 2, -0.0});
  md.set_string(meta_keys::kOptimizer, "adam");
  md.set_u64("u64.max", std::numeric_limits<uint64_t>::max());
  md.set_i64("i64.min", std::numeric_limits<int64_t>::min());
  md.set_i64("i64.neg", -17);
  md.set_f64("f64.inf", -std::numeric_limits<double>::infinity());
  md.set_f64("f64.tiny", std::numeric_limits<double>::denorm_min());
  md.set_string("str.empty", "");
  md.set_string("str.utf8", "Größe ✓ 𝔭");
  md.set_bool("flag.yes", true);
  md.set_bool("flag.no", false);
  md.set_i64_array("arr.i64", {-1, 0, std::numeric_limits<int64_t>::max()});
  md.set_i64_array("arr.i64.empty", {});
  md.set_u64_array("arr.u64.empty", {});
  md.set_f64_array("arr.f64.empty", {});
  md.set_u64("dup.a", 1);
  md.set_u64("dup.b", 2);
  return m;
}

class PoochFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = (fs::temp_directory_path() / "pooch-file-test-XXXXXX").string();
    ASSERT_NE(::mkdtemp(tmpl.data()), nullptr);
    dir_ = tmpl;
    model_ = make_model();
    path_ = dir_ + "/model.pooch";
    write_pooch_file(path_, model_.meta, model_.g, model_.tensor_data());
    good_ = slurp(path_);
  }
  void TearDown() override {
    std::error_code ec;
    fs::permissions(dir_, fs::perms::owner_all, ec);
    fs::remove_all(dir_, ec);
  }

  // Writes `b` to a scratch file and reads it; returns the error (or fails).
  Error read_error(const Bytes& b, ReadOptions opts = {}) {
    const std::string p = dir_ + "/bad.pooch";
    spit(p, b);
    try {
      read_pooch_file(p, opts);
    } catch (const Error& e) {
      return e;
    }
    ADD_FAILURE() << "the corrupted file was read without an error";
    return Error(POOCH_ERR_INTERNAL, "no error");
  }

  // Corrupts a copy of the good file with `edit`, reseals and reads it.
  void expect_error(const std::function<void(Bytes&)>& edit, bool do_reseal, pooch_status code,
                    std::vector<std::string> phrases) {
    Bytes b = good_;
    edit(b);
    if (do_reseal) reseal(b);
    const Error e = read_error(b);
    EXPECT_EQ(e.code(), code) << e.what();
    const std::string msg = e.what();
    for (const std::string& ph : phrases)
      EXPECT_NE(msg.find(ph), std::string::npos) << "'" << ph << "' missing from: " << msg;
  }

  size_t meta_off() const { return rd64(good_, kMetaOff); }
  size_t graph_off() const { return rd64(good_, kGraphOff); }
  size_t table_off() const { return rd64(good_, kTableOff); }
  size_t data_off() const { return rd64(good_, kDataOff); }
  size_t graph_tensor(std::string_view name) const {
    return find_str(good_, graph_off(), table_off(), name);
  }
  size_t table_entry(std::string_view name) const {
    return find_str(good_, table_off(), data_off(), name);
  }
  // Field offsets inside a table entry of rank `rank` whose name is `name`.
  size_t table_field(std::string_view name, size_t rank, size_t field /*0 off,1 len,2 sum*/) {
    return table_entry(name) + 4 + name.size() + 4 + 8 * rank + 8 * field;
  }
  static std::string at(size_t off) { return "at byte " + std::to_string(off); }

  std::string dir_, path_;
  Model model_;
  Bytes good_;
};

void expect_same_graph(const Graph& a, const Graph& b) {
  ASSERT_EQ(a.num_tensors(), b.num_tensors());
  for (size_t i = 0; i < a.num_tensors(); ++i) {
    const TensorDesc& x = a.tensors()[i];
    const TensorDesc& y = b.tensors()[i];
    EXPECT_EQ(x.name, y.name);
    EXPECT_EQ(x.dtype, y.dtype) << x.name;
    EXPECT_EQ(x.shape, y.shape) << x.name;
    EXPECT_EQ(x.role, y.role) << x.name;
    EXPECT_EQ(x.trainable, y.trainable) << x.name;
    EXPECT_EQ(x.sparse_rows, y.sparse_rows) << x.name;
  }
  ASSERT_EQ(a.nodes().size(), b.nodes().size());
  for (size_t k = 0; k < a.nodes().size(); ++k) {
    EXPECT_EQ(a.nodes()[k].op, b.nodes()[k].op);
    EXPECT_EQ(a.nodes()[k].inputs, b.nodes()[k].inputs);
    EXPECT_EQ(a.nodes()[k].outputs, b.nodes()[k].outputs);
    EXPECT_EQ(a.nodes()[k].attrs.items(), b.nodes()[k].attrs.items());
  }
  EXPECT_EQ(a.outputs(), b.outputs());
}

}  // namespace

// ---------------------------------------------------------------------------
// Round trips

TEST_F(PoochFileTest, RoundTripKeepsEverything) {
  for (const bool use_mmap : {true, false}) {
    SCOPED_TRACE(use_mmap ? "mmap" : "read");
    const PoochFile f = read_pooch_file(path_, ReadOptions{use_mmap, true});
    EXPECT_EQ(f.mapped(), use_mmap);
    EXPECT_EQ(f.version(), kPoochFormatVersion);
    EXPECT_EQ(f.metadata(), model_.meta);
    expect_same_graph(model_.g, f.graph());
    ASSERT_EQ(f.tensors().size(), model_.carried.size());
    for (size_t i = 0; i < model_.carried.size(); ++i) {
      const TensorEntry& e = f.tensors()[i];
      EXPECT_EQ(e.id, model_.carried[i]);
      EXPECT_EQ(f.find(e.id), &e);
      EXPECT_EQ(f.find(e.name), &e);
      EXPECT_EQ(e.offset % 64, 0u) << e.name;
      const auto d = f.data(e);
      EXPECT_EQ(reinterpret_cast<uintptr_t>(d.data()) % 64, 0u) << e.name;
      ASSERT_EQ(d.size(), model_.data[i].size()) << e.name;
      EXPECT_TRUE(
          std::equal(d.begin(), d.end(), reinterpret_cast<const std::byte*>(model_.data[i].data())))
          << e.name;
    }
    EXPECT_EQ(f.find("hidden.act"), nullptr);  // in the graph, but carries no data
    EXPECT_EQ(f.layout().file_size % 64, 0u);
    EXPECT_EQ(f.layout().data.offset % 64, 0u);
  }
  EXPECT_EQ(good_.size() % 64, 0u);
  EXPECT_EQ(std::memcmp(good_.data(), "\x89POOCH\r\n", 8), 0);
}

TEST_F(PoochFileTest, RewritingWhatWasReadGivesTheSameBytes) {
  const PoochFile f = read_pooch_file(path_);
  std::vector<TensorData> td;
  for (const TensorEntry& e : f.tensors()) td.push_back({e.id, f.data(e).data(), e.bytes, {}});
  const std::string again = dir_ + "/again.pooch";
  write_pooch_file(again, f.metadata(), f.graph(), td);
  EXPECT_EQ(slurp(again), good_);
}

// Tensors given by `fill` instead of a pointer (a session's blocked or
// device-resident tensors) make the same file; each is filled twice (the
// checksum, then the write).
TEST_F(PoochFileTest, FilledTensorsGiveTheSameBytes) {
  const PoochFile f = read_pooch_file(path_);
  std::vector<TensorData> td;
  std::vector<int> calls(f.tensors().size(), 0);
  for (size_t i = 0; i < f.tensors().size(); ++i) {
    const TensorEntry& e = f.tensors()[i];
    const auto d = f.data(e);
    td.push_back({e.id, nullptr, e.bytes, [d, &calls, i](std::byte* to) {
                    ++calls[i];
                    std::memcpy(to, d.data(), d.size());
                  }});
  }
  const std::string again = dir_ + "/filled.pooch";
  write_pooch_file(again, f.metadata(), f.graph(), td);
  EXPECT_EQ(slurp(again), good_);
  for (size_t i = 0; i < calls.size(); ++i)
    EXPECT_EQ(calls[i], f.tensors()[i].bytes ? 2 : 0) << f.tensors()[i].name;
}

TEST_F(PoochFileTest, NanMetadataKeepsItsBits) {
  Metadata md;
  const double nan = std::bit_cast<double>(uint64_t{0x7FF800000000BEEFull});
  md.set_f64("nan", nan);
  md.set_f64_array("nans", {nan, -nan});
  Graph g;
  g.add_tensor({"only", DType::u8, {3}, Role::input});
  const std::string p = dir_ + "/nan.pooch";
  write_pooch_file(p, md, g, {});
  const PoochFile f = read_pooch_file(p);
  EXPECT_EQ(std::bit_cast<uint64_t>(f.metadata().get_f64("nan")), 0x7FF800000000BEEFull);
  EXPECT_EQ(std::bit_cast<uint64_t>(f.metadata().get_f64_array("nans")[1]),
            std::bit_cast<uint64_t>(-nan));
  EXPECT_TRUE(f.tensors().empty());
  EXPECT_EQ(f.layout().data.size, 0u);
}

TEST_F(PoochFileTest, EmptyGraphAndMetadata) {
  const std::string p = dir_ + "/empty.pooch";
  write_pooch_file(p, Metadata{}, Graph{}, {});
  const PoochFile f = read_pooch_file(p);
  EXPECT_TRUE(f.metadata().empty());
  EXPECT_EQ(f.graph().num_tensors(), 0u);
  EXPECT_TRUE(f.tensors().empty());
}

TEST(Metadata, TypedAccessNamesTheKey) {
  Metadata md;
  md.set_u64("step", 5);
  md.set_string("kind", "model");
  EXPECT_EQ(md.get_u64("step"), 5u);
  EXPECT_EQ(md.type("kind"), MetaType::string);
  EXPECT_FALSE(md.type("nope").has_value());
  try {
    md.get_i64("step");
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), POOCH_ERR_BAD_INPUT);
    EXPECT_NE(std::string(e.what()).find("'step' holds type u64, not i64"), std::string::npos)
        << e.what();
  }
  try {
    md.get_f64("lr");
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), POOCH_ERR_BAD_INPUT);
    EXPECT_NE(std::string(e.what()).find("'lr'"), std::string::npos) << e.what();
  }
  md.set_f64("step", 1.5);  // a set replaces the value and its type
  EXPECT_EQ(md.get_f64("step"), 1.5);
  EXPECT_TRUE(md.erase("step"));
  EXPECT_FALSE(md.has("step"));
  for (const std::string& bad :
       {std::string(), std::string("a\0b", 3), std::string("\xC0\x80"), std::string(5000, 'k')}) {
    try {
      md.set_u64(bad, 1);
      FAIL() << "accepted a bad key";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), POOCH_ERR_INVALID_ARG);
    }
  }
  EXPECT_THROW(md.set_string("s", "\xFF"), Error);
}

// ---------------------------------------------------------------------------
// Reader errors, one per rule

TEST_F(PoochFileTest, Truncated) {
  for (size_t keep : {size_t{0}, size_t{5}, size_t{100}}) {
    Bytes b(good_.begin(), good_.begin() + static_cast<ptrdiff_t>(keep));
    const Error e = read_error(b);
    EXPECT_EQ(e.code(), POOCH_ERR_BAD_INPUT);
    EXPECT_NE(std::string(e.what()).find("truncated"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find(at(keep)), std::string::npos) << e.what();
  }
  Bytes b(good_.begin(), good_.end() - 10);
  const Error e = read_error(b);
  EXPECT_EQ(e.code(), POOCH_ERR_BAD_INPUT);
  EXPECT_NE(std::string(e.what()).find("truncated: the header says"), std::string::npos)
      << e.what();
  EXPECT_NE(std::string(e.what()).find(at(b.size())), std::string::npos) << e.what();
}

TEST_F(PoochFileTest, WrongMagic) {
  expect_error([](Bytes& b) { std::memcpy(b.data(), "GGUF\3\0\0\0", 8); }, false,
               POOCH_ERR_BAD_INPUT, {"not a .pooch file", "47 47 55 46", at(0)});
}

TEST_F(PoochFileTest, FutureAndZeroVersion) {
  expect_error([](Bytes& b) { wr32(b, kVersion, 2); }, true, POOCH_ERR_UNSUPPORTED,
               {"format version 2 is newer", at(8), "upgrade pooch"});
  // Checked before the header checksum: a newer header may differ anywhere.
  expect_error([](Bytes& b) { wr32(b, kVersion, 7); }, false, POOCH_ERR_UNSUPPORTED,
               {"format version 7"});
  expect_error([](Bytes& b) { wr32(b, kVersion, 0); }, true, POOCH_ERR_BAD_INPUT,
               {"format version 0", at(8)});
}

TEST_F(PoochFileTest, HeaderChecksumFlagsAndReserved) {
  expect_error([](Bytes& b) { b[kDataSize] ^= 1; }, false, POOCH_ERR_BAD_INPUT,
               {"header checksum mismatch", at(120)});
  expect_error([](Bytes& b) { wr32(b, kFlags, 4); }, true, POOCH_ERR_BAD_INPUT,
               {"unknown header flags", at(12)});
  expect_error([](Bytes& b) { b[115] = 1; }, true, POOCH_ERR_BAD_INPUT,
               {"nonzero reserved header bytes", at(112)});
}

TEST_F(PoochFileTest, TrailingBytes) {
  const size_t n = good_.size();
  expect_error([](Bytes& b) { b.resize(b.size() + 64, 0); }, false, POOCH_ERR_BAD_INPUT,
               {"trailing bytes", at(n)});
}

TEST_F(PoochFileTest, SectionLayout) {
  expect_error([](Bytes& b) { wr64(b, kGraphOff, rd64(b, kGraphOff) + 8); }, true,
               POOCH_ERR_BAD_INPUT, {"bad section layout", "graph_offset", at(kGraphOff)});
  expect_error([](Bytes& b) { wr64(b, kMetaSize, 1ull << 60); }, true, POOCH_ERR_BAD_INPUT,
               {"bad section layout", "metadata_size", at(kMetaSize)});
  expect_error([](Bytes& b) { wr64(b, kDataOff, rd64(b, kDataOff) + 64); }, true,
               POOCH_ERR_BAD_INPUT, {"bad section layout", "data_offset", at(kDataOff)});
  expect_error([](Bytes& b) { wr64(b, kMetaOff, 0); }, true, POOCH_ERR_BAD_INPUT,
               {"bad section layout", at(kMetaOff)});
}

TEST_F(PoochFileTest, SectionChecksums) {
  expect_error([&](Bytes& b) { b[meta_off() + 9] ^= 0x40; }, false, POOCH_ERR_BAD_INPUT,
               {"metadata checksum mismatch", at(meta_off())});
  expect_error([&](Bytes& b) { b[graph_off() + 9] ^= 0x40; }, false, POOCH_ERR_BAD_INPUT,
               {"graph checksum mismatch", at(graph_off())});
  expect_error([&](Bytes& b) { b[table_off() + 9] ^= 0x40; }, false, POOCH_ERR_BAD_INPUT,
               {"tensor table checksum mismatch", at(table_off())});
}

TEST_F(PoochFileTest, AbsurdCounts) {
  expect_error([&](Bytes& b) { wr32(b, graph_off(), 1u << 24); }, true, POOCH_ERR_BAD_INPUT,
               {"too many tensors", "cannot fit", at(graph_off())});
  expect_error([&](Bytes& b) { wr32(b, graph_off(), 0xFFFFFFFFu); }, true, POOCH_ERR_BAD_INPUT,
               {"too many tensors", "the limit is 16777216", at(graph_off())});
  expect_error([&](Bytes& b) { wr32(b, meta_off(), 60000); }, true, POOCH_ERR_BAD_INPUT,
               {"too many metadata entries", at(meta_off())});
  expect_error([&](Bytes& b) { wr32(b, table_off(), 1000); }, true, POOCH_ERR_BAD_INPUT,
               {"too many tensor table entries", at(table_off())});
  // An array claiming more elements than the section holds.
  const size_t arr = find_str(good_, meta_off(), graph_off(), "arr.i64") + 4 + 7 + 1;
  expect_error([&](Bytes& b) { wr32(b, arr, 1u << 20); }, true, POOCH_ERR_BAD_INPUT,
               {"too many array elements", at(arr)});
}

TEST_F(PoochFileTest, SectionEndsInsideARecordOrHasExtraBytes) {
  expect_error([&](Bytes& b) { wr32(b, meta_off(), rd32(b, meta_off()) + 1); }, true,
               POOCH_ERR_BAD_INPUT, {"metadata section ends inside metadata entry", "key"});
  expect_error([&](Bytes& b) { wr32(b, meta_off(), rd32(b, meta_off()) - 1); }, true,
               POOCH_ERR_BAD_INPUT, {"extra bytes", "metadata section"});
}

TEST_F(PoochFileTest, MetadataTypeDuplicateAndBool) {
  const size_t key = find_str(good_, meta_off(), graph_off(), "train.step");
  const size_t type_at = key + 4 + 10;
  expect_error([&](Bytes& b) { b[type_at] = 42; }, true, POOCH_ERR_BAD_INPUT,
               {"unknown metadata type 42", "'train.step'", at(type_at)});
  const size_t dup_b = find_str(good_, meta_off(), graph_off(), "dup.b");
  expect_error([&](Bytes& b) { b[dup_b + 8] = 'a'; }, true, POOCH_ERR_BAD_INPUT,
               {"duplicate metadata key 'dup.a'", at(dup_b)});
  const size_t yes = find_str(good_, meta_off(), graph_off(), "flag.yes") + 4 + 8 + 1;
  expect_error([&](Bytes& b) { b[yes] = 2; }, true, POOCH_ERR_BAD_INPUT,
               {"bad bool", "'flag.yes'", at(yes)});
}

TEST_F(PoochFileTest, BadStrings) {
  const size_t t = graph_tensor("hidden.pre");
  expect_error([&](Bytes& b) { b[t + 5] = 0xFF; }, true, POOCH_ERR_BAD_INPUT,
               {"bad string", "tensor 6's name is not valid UTF-8", at(t)});
  expect_error([&](Bytes& b) { b[t + 5] = 0; }, true, POOCH_ERR_BAD_INPUT,
               {"bad string", "NUL", at(t)});
  expect_error([&](Bytes& b) { wr32(b, t, 0); }, true, POOCH_ERR_BAD_INPUT,
               {"bad string", "is empty", at(t)});
  expect_error([&](Bytes& b) { wr32(b, t, 5000); }, true, POOCH_ERR_BAD_INPUT,
               {"bad string", "5000 bytes long", at(t)});
}

TEST_F(PoochFileTest, UnknownDtypeRoleFlagsRankDims) {
  const size_t w1 = graph_tensor("w1");
  const size_t dtype = w1 + 4 + 2, role = dtype + 1, flags = dtype + 2, rank = dtype + 3,
               dims = dtype + 8;
  expect_error([&](Bytes& b) { b[dtype] = 99; }, true, POOCH_ERR_BAD_INPUT,
               {"unknown dtype 99", "'w1'", at(dtype)});
  expect_error([&](Bytes& b) { b[role] = 7; }, true, POOCH_ERR_BAD_INPUT,
               {"unknown role 7", "'w1'", at(role)});
  expect_error([&](Bytes& b) { b[flags] = 3; }, true, POOCH_ERR_BAD_INPUT,
               {"unknown tensor flags 0x03", at(flags)});
  expect_error([&](Bytes& b) { b[rank] = 9; }, true, POOCH_ERR_BAD_INPUT,
               {"rank 9", "'w1'", at(rank)});
  expect_error([&](Bytes& b) { wr64(b, dims + 8, static_cast<uint64_t>(-1)); }, true,
               POOCH_ERR_BAD_INPUT, {"bad dimension -1", "'w1'", at(dims + 8)});
  expect_error(
      [&](Bytes& b) {
        wr64(b, dims, 1ull << 40);
        wr64(b, dims + 8, 1ull << 40);
      },
      true, POOCH_ERR_BAD_INPUT, {"bad dimension", "more than 2^62 bytes", at(dims)});
}

TEST_F(PoochFileTest, DuplicateTensorName) {
  const size_t b1 = graph_tensor("b1");
  expect_error([&](Bytes& b) { b[b1 + 4] = 'w'; }, true, POOCH_ERR_BAD_INPUT,
               {"duplicate tensor name 'w1'", at(b1)});
}

TEST_F(PoochFileTest, TensorIdOutOfRange) {
  // The relu node: op "relu", counts (1 input, 1 output, 0 attrs), then ids.
  const size_t relu = find_str(good_, graph_off(), table_off(), "relu");
  const size_t input = relu + 4 + 4 + 4;
  expect_error([&](Bytes& b) { wr32(b, input, 100000); }, true, POOCH_ERR_BAD_INPUT,
               {"tensor id out of range", "input 0 of node 1 ('relu') is 100000", at(input)});
  const size_t w1 = graph_tensor("w1");
  const size_t sr = w1 + 4 + 2 + 4;
  expect_error([&](Bytes& b) { wr32(b, sr, static_cast<uint32_t>(-5)); }, true, POOCH_ERR_BAD_INPUT,
               {"tensor id out of range", "sparse_rows", at(sr)});
  expect_error([&](Bytes& b) { wr32(b, sr, 2); }, true, POOCH_ERR_BAD_INPUT,
               {"tensor id out of range", "to itself", at(sr)});
  // The graph outputs are the section's last 4 + 2×4 bytes.
  const size_t outs = table_off() - 8;
  expect_error([&](Bytes& b) { wr32(b, outs, 1u << 30); }, true, POOCH_ERR_BAD_INPUT,
               {"tensor id out of range", "graph output 0", at(outs)});
  expect_error([&](Bytes& b) { wr32(b, outs, rd32(b, outs + 4)); }, true, POOCH_ERR_BAD_INPUT,
               {"duplicate graph output", at(outs + 4)});
}

TEST_F(PoochFileTest, UnknownOpKind) {
  const size_t relu = find_str(good_, graph_off(), table_off(), "relu");
  expect_error([&](Bytes& b) { b[relu + 7] = 'x'; }, true, POOCH_ERR_BAD_INPUT,
               {"unknown op kind 'relx'", "node 1", at(relu)});
}

TEST_F(PoochFileTest, OperandCountAndAttributes) {
  const size_t relu = find_str(good_, graph_off(), table_off(), "relu");
  expect_error([&](Bytes& b) { b[relu + 8] = 2; }, true, POOCH_ERR_BAD_INPUT,
               {"operand count", "'relu'", "has 2 inputs", at(relu + 8)});
  expect_error([&](Bytes& b) { b[relu + 9] = 9; }, true, POOCH_ERR_BAD_INPUT,
               {"operand count", "9 outputs", at(relu + 9)});
  expect_error([&](Bytes& b) { wr16(b, relu + 10, 65); }, true, POOCH_ERR_BAD_INPUT,
               {"too many attributes", at(relu + 10)});
  // The first adam_update's attributes are sorted: beta1 comes first.
  const size_t beta1 = find_str(good_, graph_off(), table_off(), "beta1");
  expect_error([&](Bytes& b) { wrf64(b, beta1 + 9, std::nan("")); }, true, POOCH_ERR_BAD_INPUT,
               {"bad attribute value", "'beta1'", at(beta1 + 9)});
  expect_error([&](Bytes& b) { wrf64(b, beta1 + 9, 1e300); }, true, POOCH_ERR_BAD_INPUT,
               {"bad attribute value", at(beta1 + 9)});
  const size_t beta2 = find_str(good_, beta1, table_off(), "beta2");
  expect_error([&](Bytes& b) { b[beta2 + 8] = '1'; }, true, POOCH_ERR_BAD_INPUT,
               {"duplicate attribute 'beta1'", at(beta2)});
}

TEST_F(PoochFileTest, ShapeInferenceDisagrees) {
  // hidden.act is relu's output: store it with another width.
  const size_t act = graph_tensor("hidden.act");
  const size_t dim1 = act + 4 + 10 + 8 + 8;
  expect_error([&](Bytes& b) { wr64(b, dim1, 65); }, true, POOCH_ERR_BAD_INPUT,
               {"shape inference", "'hidden.act'", "f32 [4,65]", "f32 [4,64]", at(act)});
  // Inputs that the op itself rejects: w1 with another input width.
  const size_t w1 = graph_tensor("w1");
  expect_error([&](Bytes& b) { wr64(b, w1 + 4 + 2 + 8 + 8, 31); }, true, POOCH_ERR_BAD_INPUT,
               {"shape inference", "rejects its inputs", "node 0 ('linear')"});
}

TEST_F(PoochFileTest, GraphOrder) {
  // Node 1 (relu) reads the loss, which a later node produces.
  const size_t relu = find_str(good_, graph_off(), table_off(), "relu");
  const TensorId loss = *model_.g.find("loss");
  expect_error([&](Bytes& b) { wr32(b, relu + 12, static_cast<uint32_t>(loss)); }, true,
               POOCH_ERR_BAD_INPUT, {"graph order", "node 1 ('relu') reads tensor", at(relu)});
  // Node 1 claims node 0's output as its own.
  expect_error([&](Bytes& b) { wr32(b, relu + 16, rd32(b, relu + 12)); }, true, POOCH_ERR_BAD_INPUT,
               {"graph order", at(relu)});
}

TEST_F(PoochFileTest, TableEntryNotInGraphDisagreesOrWrongLength) {
  const size_t w2 = table_entry("w2");
  expect_error([&](Bytes& b) { b[w2 + 5] = '9'; }, true, POOCH_ERR_BAD_INPUT,
               {"table entry 2 'w9' is not in the graph", at(w2)});
  expect_error([&](Bytes& b) { b[w2 + 6] = static_cast<unsigned char>(DType::i32); }, true,
               POOCH_ERR_BAD_INPUT, {"disagrees with the graph", "i32 [3,64]", at(w2)});
  expect_error([&](Bytes& b) { b[w2 + 7] = static_cast<unsigned char>(Role::input); }, true,
               POOCH_ERR_BAD_INPUT, {"disagrees with the graph", at(w2)});
  expect_error([&](Bytes& b) { b[w2 + 9] = 1; }, true, POOCH_ERR_BAD_INPUT,
               {"unknown tensor flags", "reserved byte", at(w2 + 9)});
  const size_t len = table_field("w2", 2, 1);
  expect_error([&](Bytes& b) { wr64(b, len, rd64(b, len) + 4); }, true, POOCH_ERR_BAD_INPUT,
               {"byte length 772", "takes 768 bytes", at(len)});
  // A length that matches a changed shape but not the graph.
  expect_error(
      [&](Bytes& b) {
        wr64(b, w2 + 10, 6);
        wr64(b, w2 + 18, 32);
      },
      true, POOCH_ERR_BAD_INPUT, {"disagrees with the graph", "[6,32]", at(w2)});
  // The same tensor twice: entry 3 (b2) renamed to b1.
  const size_t b2 = table_entry("b2");
  expect_error([&](Bytes& b) { b[b2 + 5] = '1'; }, true, POOCH_ERR_BAD_INPUT,
               {"duplicate tensor name 'b1' in the tensor table", at(b2)});
}

TEST_F(PoochFileTest, TableOffsets) {
  const size_t off0 = table_field("w1", 2, 0);  // entry 0, data offset 0
  const size_t off1 = table_field("b1", 1, 0);  // entry 1, right after w1's 8192 bytes
  const uint64_t data_size = rd64(good_, kDataSize);
  expect_error([&](Bytes& b) { wr64(b, off1, rd64(b, off1) + 8); }, true, POOCH_ERR_BAD_INPUT,
               {"misaligned data offset", "'b1'", at(off1)});
  expect_error([&](Bytes& b) { wr64(b, off1, 0); }, true, POOCH_ERR_BAD_INPUT,
               {"overlap", "'b1'", at(off1)});
  expect_error([&](Bytes& b) { wr64(b, off0, 64); }, true, POOCH_ERR_BAD_INPUT,
               {"hole", "'w1'", at(off0)});
  expect_error([&](Bytes& b) { wr64(b, off1, data_size); }, true, POOCH_ERR_BAD_INPUT,
               {"out of range", "'b1'", at(off1)});
  expect_error([&](Bytes& b) { wr64(b, off1, 1ull << 63); }, true, POOCH_ERR_BAD_INPUT,
               {"out of range", at(off1)});
  // A data section longer than its entries need.
  expect_error(
      [&](Bytes& b) {
        b.resize(b.size() + 64, 0);
        wr64(b, kFileSize, b.size());
        wr64(b, kDataSize, rd64(b, kDataSize) + 64);
      },
      true, POOCH_ERR_BAD_INPUT, {"data size", at(kDataSize)});
}

TEST_F(PoochFileTest, NonzeroPadding) {
  // head.index is u16 [3,5]: 30 bytes, then 34 bytes of padding.
  const PoochFile f = read_pooch_file(path_);
  const TensorEntry* e = f.find("head.index");
  ASSERT_NE(e, nullptr);
  const size_t pad = e->offset + e->bytes + 3;
  expect_error([&](Bytes& b) { b[pad] = 0x5A; }, false, POOCH_ERR_BAD_INPUT,
               {"nonzero padding byte 0x5a", at(pad)});
  const size_t table_end = table_off() + rd64(good_, kTableSize);
  if (table_end < data_off()) {
    expect_error([&](Bytes& b) { b[table_end] = 1; }, false, POOCH_ERR_BAD_INPUT,
                 {"nonzero padding", "before the data section", at(table_end)});
  }
}

TEST_F(PoochFileTest, DataChecksum) {
  const PoochFile f = read_pooch_file(path_);
  const TensorEntry* e = f.find("w2.m");
  ASSERT_NE(e, nullptr);
  Bytes b = good_;
  b[e->offset + 17] ^= 0x01;
  const Error err = read_error(b);
  EXPECT_EQ(err.code(), POOCH_ERR_BAD_INPUT);
  EXPECT_NE(std::string(err.what()).find("data checksum mismatch for tensor 'w2.m'"),
            std::string::npos)
      << err.what();
  EXPECT_NE(std::string(err.what()).find(at(e->offset)), std::string::npos) << err.what();
  // Without the check at open, the same damage is found on demand.
  const PoochFile lazy = read_pooch_file(dir_ + "/bad.pooch", ReadOptions{true, false});
  EXPECT_THROW(lazy.verify(*lazy.find("w2.m")), Error);
  EXPECT_NO_THROW(lazy.verify(*lazy.find("w1")));
}

TEST_F(PoochFileTest, OsErrors) {
  // A FIFO is refused at once (not waited on for a writer), as not a regular file.
  const std::string fifo = dir_ + "/fifo.pooch";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  for (const std::string& p : {dir_ + "/missing.pooch", dir_, fifo}) {
    try {
      read_pooch_file(p);
      FAIL() << p;
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), POOCH_ERR_IO);
      EXPECT_NE(std::string(e.what()).find(p), std::string::npos) << e.what();
      if (p != dir_ + "/missing.pooch") {
        EXPECT_NE(std::string(e.what()).find("give the path of a .pooch file"), std::string::npos)
            << e.what();
      }
    }
  }
}

// ---------------------------------------------------------------------------
// Writer: argument checks and atomicity

TEST_F(PoochFileTest, WriterRefusesBadArgumentsWithoutTouchingTheFile) {
  auto td = model_.tensor_data();
  auto expect_refused = [&](std::vector<TensorData> t, const Graph& g, const char* phrase) {
    try {
      write_pooch_file(path_, model_.meta, g, t);
      FAIL() << phrase;
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), POOCH_ERR_INVALID_ARG) << e.what();
      EXPECT_NE(std::string(e.what()).find(phrase), std::string::npos) << e.what();
    }
    EXPECT_EQ(slurp(path_), good_);
    EXPECT_TRUE(temp_files_in(dir_).empty());
  };
  auto wrong_size = td;
  wrong_size[0].bytes -= 1;
  expect_refused(wrong_size, model_.g, "bytes were given");
  auto twice = td;
  twice.push_back(td[0]);
  expect_refused(twice, model_.g, "given twice");
  auto bad_id = td;
  bad_id[1].id = 100000;
  expect_refused(bad_id, model_.g, "names tensor id 100000");
  // A graph edited behind add_op's back no longer replays: refused, not written.
  Graph edited = model_.g;
  edited.tensor(*edited.find("hidden.act")).shape = {4, 65};
  expect_refused(td, edited, "shape inference");
  Graph linked = model_.g;
  linked.tensor(0).sparse_rows = 1 << 20;
  expect_refused(td, linked, "tensor id out of range");
}

TEST_F(PoochFileTest, FailedWritesLeaveTheOldFileAndNoTempFile) {
  // The directory does not exist.
  try {
    write_pooch_file(dir_ + "/no/such/dir/m.pooch", model_.meta, model_.g, model_.tensor_data());
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), POOCH_ERR_IO);
    EXPECT_NE(std::string(e.what()).find("no/such/dir/m.pooch"), std::string::npos) << e.what();
  }
  // The target is a non-empty directory: everything succeeds but the rename.
  const std::string sub = dir_ + "/occupied";
  fs::create_directory(sub);
  spit(sub + "/keep", Bytes{1, 2, 3});
  try {
    write_pooch_file(sub, model_.meta, model_.g, model_.tensor_data());
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), POOCH_ERR_IO);
    EXPECT_NE(std::string(e.what()).find("renaming"), std::string::npos) << e.what();
  }
  EXPECT_EQ(slurp(sub + "/keep"), (Bytes{1, 2, 3}));
  EXPECT_TRUE(temp_files_in(dir_).empty());
  EXPECT_EQ(slurp(path_), good_);
}

TEST_F(PoochFileTest, ShortWriteLeavesTheOldFile) {
  // A file size limit makes write() stop short at the limit and then fail
  // with EFBIG: a real short write, from the kernel, in the middle of the data.
  Model big = make_model();
  big.meta.set_string("pad", std::string(200, 'p'));
  struct rlimit old {};
  ASSERT_EQ(::getrlimit(RLIMIT_FSIZE, &old), 0);
  auto* old_handler = ::signal(SIGXFSZ, SIG_IGN);
  struct rlimit lim = old;
  lim.rlim_cur = good_.size() / 2 + 7;
  ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &lim), 0);
  std::string msg;
  pooch_status code = POOCH_ERR_INTERNAL;
  try {
    write_pooch_file(path_, big.meta, big.g, big.tensor_data());
  } catch (const Error& e) {
    msg = e.what();
    code = e.code();
  }
  ::setrlimit(RLIMIT_FSIZE, &old);
  ::signal(SIGXFSZ, old_handler);
  EXPECT_EQ(code, POOCH_ERR_IO) << msg;
  EXPECT_NE(msg.find("write byte"), std::string::npos) << msg;
  EXPECT_NE(msg.find("left unchanged"), std::string::npos) << msg;
  EXPECT_EQ(slurp(path_), good_);
  EXPECT_TRUE(temp_files_in(dir_).empty());
  // And with the limit lifted the same write goes through.
  write_pooch_file(path_, big.meta, big.g, big.tensor_data());
  EXPECT_EQ(read_pooch_file(path_).metadata().get_string("pad"), std::string(200, 'p'));
}

TEST_F(PoochFileTest, ReadOnlyDirectory) {
  if (::geteuid() == 0) GTEST_SKIP() << "root writes into read-only directories";
  const std::string ro = dir_ + "/ro";
  fs::create_directory(ro);
  write_pooch_file(ro + "/m.pooch", model_.meta, model_.g, model_.tensor_data());
  fs::permissions(ro, fs::perms::owner_read | fs::perms::owner_exec);
  EXPECT_THROW(write_pooch_file(ro + "/m.pooch", Metadata{}, Graph{}, {}), Error);
  fs::permissions(ro, fs::perms::owner_all);
  EXPECT_EQ(slurp(ro + "/m.pooch"), good_);
  EXPECT_TRUE(temp_files_in(ro).empty());
}

// ---------------------------------------------------------------------------
// Fuzz: damaged files are refused with pooch::Error, never a crash.

TEST_F(PoochFileTest, FuzzFlipsAndTruncations) {
  std::mt19937_64 rng(2024);
  const std::string p = dir_ + "/fuzz.pooch";
  const size_t front = data_off();
  int accepted = 0;
  for (int it = 0; it < 2000; ++it) {
    Bytes b = good_;
    const int kind = static_cast<int>(rng() % 8);
    if (kind == 0) {
      b.resize(rng() % b.size());
    } else {
      // Mostly in the structure (where the parsers are), sometimes anywhere.
      const size_t pos = kind < 6 ? rng() % front : rng() % b.size();
      b[pos] ^= static_cast<unsigned char>(1 + rng() % 255);
      if (kind >= 2 && kind < 6) reseal(b);  // let the edit reach the parser
    }
    spit(p, b);
    try {
      const PoochFile f = read_pooch_file(p, ReadOptions{(it & 1) != 0, true});
      ++accepted;  // a flip of a value no rule constrains (a weight, a metadata number)
    } catch (const Error& e) {
      EXPECT_TRUE(e.code() == POOCH_ERR_BAD_INPUT || e.code() == POOCH_ERR_UNSUPPORTED) << e.what();
      EXPECT_NE(std::string(e.what()).find("at byte"), std::string::npos) << e.what();
    } catch (const std::exception& e) {
      ADD_FAILURE() << "iteration " << it << ": not a pooch::Error: " << e.what();
    }
  }
  RecordProperty("accepted", accepted);
}
