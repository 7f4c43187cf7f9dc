// The .pooch container (docs/FORMAT.md): typed metadata, the graph and the
// data of the tensors a model or checkpoint carries. Writes are atomic; the
// reader checks every byte it relies on and maps tensor data in place.
#pragma once
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "../runtime/core/graph.h"

namespace pooch {

inline constexpr uint32_t kPoochFormatVersion = 1;
inline constexpr uint64_t kPoochAlign = 64;
inline constexpr uint64_t kPoochHeaderBytes = 128;

// The limits of docs/FORMAT.md "Limits the reader enforces"; the writer
// refuses anything the reader would refuse.
namespace pooch_limits {
inline constexpr uint32_t kMaxNameBytes = 4096;
inline constexpr uint32_t kMaxStringBytes = 16u << 20;
inline constexpr uint32_t kMaxMetaEntries = 65536;
inline constexpr uint32_t kMaxArrayElems = 1u << 24;
inline constexpr uint32_t kMaxTensors = 1u << 24;
inline constexpr uint32_t kMaxNodes = 1u << 24;
inline constexpr uint32_t kMaxAttrs = 64;
inline constexpr int64_t kMaxDim = int64_t{1} << 48;
inline constexpr uint64_t kMaxTensorBytes = pooch::kMaxTensorBytes;
}  // namespace pooch_limits

// Conventional metadata keys (docs/FORMAT.md "Models and checkpoints").
namespace meta_keys {
inline constexpr std::string_view kKind = "pooch.kind";  // "model" | "checkpoint"
inline constexpr std::string_view kStep = "train.step";
inline constexpr std::string_view kEpoch = "train.epoch";
inline constexpr std::string_view kRngSeed = "train.rng.seed";
inline constexpr std::string_view kRngState = "train.rng.state";
inline constexpr std::string_view kDataSeed = "train.data.seed";
inline constexpr std::string_view kDataPosition = "train.data.position";
inline constexpr std::string_view kLr = "train.lr";
inline constexpr std::string_view kLrSchedule = "train.lr_schedule";
inline constexpr std::string_view kLrScheduleState = "train.lr_schedule.state";
inline constexpr std::string_view kOptimizer = "train.optimizer";
inline constexpr std::string_view kLossSum = "train.loss_sum";   // of the epoch's batches so far
inline constexpr std::string_view kFinished = "train.finished";  // early stopping ended the run
// What the run trains on (data_fingerprint): a resume on other data is refused.
inline constexpr std::string_view kDataFingerprint = "train.data.fingerprint";
inline constexpr std::string_view kModelSpec = "model.spec";      // the family's spec (JSON)
inline constexpr std::string_view kModelFamily = "model.family";  // "xmc", "mlp", ...
inline constexpr std::string_view kModelIo = "model.io";          // inputs, outputs, losses (JSON)
}  // namespace meta_keys

// The on-disk type tags of metadata values.
enum class MetaType : uint8_t {
  u64 = 1,
  i64 = 2,
  f64 = 3,
  string = 4,
  boolean = 5,
  u64_array = 6,
  i64_array = 7,
  f64_array = 8,
};
const char* meta_type_name(MetaType t);

// A small typed key/value map. Setters check the key and value against the
// format's limits (Error POOCH_ERR_INVALID_ARG), so whatever is set can be
// written. Getters throw Error POOCH_ERR_BAD_INPUT naming the key when it is
// missing or holds another type: metadata is read from files, so a missing
// or mistyped entry means a file that lacks what the caller needs.
class Metadata {
 public:
  // The variant's alternative index + 1 is the MetaType tag.
  using Value = std::variant<uint64_t, int64_t, double, std::string, bool, std::vector<uint64_t>,
                             std::vector<int64_t>, std::vector<double>>;

  void set_u64(std::string_view key, uint64_t v) { set(key, Value(std::in_place_index<0>, v)); }
  void set_i64(std::string_view key, int64_t v) { set(key, Value(std::in_place_index<1>, v)); }
  void set_f64(std::string_view key, double v) { set(key, Value(std::in_place_index<2>, v)); }
  void set_string(std::string_view key, std::string_view v) {
    set(key, Value(std::in_place_index<3>, std::string(v)));
  }
  void set_bool(std::string_view key, bool v) { set(key, Value(std::in_place_index<4>, v)); }
  void set_u64_array(std::string_view key, std::vector<uint64_t> v) {
    set(key, Value(std::in_place_index<5>, std::move(v)));
  }
  void set_i64_array(std::string_view key, std::vector<int64_t> v) {
    set(key, Value(std::in_place_index<6>, std::move(v)));
  }
  void set_f64_array(std::string_view key, std::vector<double> v) {
    set(key, Value(std::in_place_index<7>, std::move(v)));
  }
  // Any value; checks it as the typed setters do.
  void set(std::string_view key, Value v);

  uint64_t get_u64(std::string_view key) const { return get<0>(key); }
  int64_t get_i64(std::string_view key) const { return get<1>(key); }
  double get_f64(std::string_view key) const { return get<2>(key); }
  const std::string& get_string(std::string_view key) const { return get<3>(key); }
  bool get_bool(std::string_view key) const { return get<4>(key); }
  const std::vector<uint64_t>& get_u64_array(std::string_view key) const { return get<5>(key); }
  const std::vector<int64_t>& get_i64_array(std::string_view key) const { return get<6>(key); }
  const std::vector<double>& get_f64_array(std::string_view key) const { return get<7>(key); }

  bool has(std::string_view key) const { return kv_.find(key) != kv_.end(); }
  std::optional<MetaType> type(std::string_view key) const;
  const Value* find(std::string_view key) const;  // nullptr when absent
  bool erase(std::string_view key);
  size_t size() const { return kv_.size(); }
  bool empty() const { return kv_.empty(); }
  const std::map<std::string, Value, std::less<>>& items() const { return kv_; }

  bool operator==(const Metadata& o) const = default;

 private:
  template <size_t I>
  const std::variant_alternative_t<I, Value>& get(std::string_view key) const {
    const Value& v = checked(key, static_cast<MetaType>(I + 1));
    return std::get<I>(v);
  }
  const Value& checked(std::string_view key, MetaType want) const;

  std::map<std::string, Value, std::less<>> kv_;
};

// One tensor's data for the writer: `bytes` must equal the graph tensor's
// dtype size × numel. The pointer is only read during the call. Where
// `data` is null, `fill` writes the bytes into a buffer of `bytes` instead:
// it is called twice (for the checksum, then for the write) and must give
// the same bytes both times; the writer holds one such tensor at a time,
// so a file is written without its size in memory.
struct TensorData {
  TensorId id = kNoTensor;
  const void* data = nullptr;
  size_t bytes = 0;
  std::function<void(std::byte* to)> fill;
};

// Writes `path` atomically (docs/FORMAT.md "Writing"): the tensors' data go
// into the data section in the order given. Throws Error POOCH_ERR_INVALID_ARG
// when the arguments cannot make a valid file (nothing is touched then) and
// POOCH_ERR_IO when the OS fails (the temporary file is removed and an
// existing file at `path` is left as it was).
void write_pooch_file(const std::string& path, const Metadata& meta, const Graph& graph,
                      std::span<const TensorData> tensors);

// One tensor-table entry, checked against the graph.
struct TensorEntry {
  std::string name;
  TensorId id = kNoTensor;  // in PoochFile::graph()
  DType dtype = DType::f32;
  Shape shape;
  Role role = Role::weight;
  uint64_t offset = 0;  // absolute byte offset of the data in the file (a multiple of 64)
  uint64_t bytes = 0;
  uint64_t xxh3 = 0;
  uint64_t record_offset = 0;  // where its table record starts, for messages
};

struct FileSection {
  uint64_t offset = 0;
  uint64_t size = 0;
};

struct FileLayout {
  uint64_t file_size = 0;
  FileSection metadata, graph, table, data;
};

struct ReadOptions {
  bool use_mmap = true;     // false: read the file into memory (the fallback path)
  bool verify_data = true;  // check every tensor's checksum while opening
};

// An opened .pooch file. Tensor data stay in the mapping (or buffer) this
// object owns; the spans from data() live as long as it does (moves keep
// them valid). Safe to read from many threads once constructed.
class PoochFile {
 public:
  PoochFile(PoochFile&&) noexcept;
  PoochFile& operator=(PoochFile&&) noexcept;
  ~PoochFile();

  const std::string& path() const { return path_; }
  uint32_t version() const { return version_; }
  const FileLayout& layout() const { return layout_; }
  const Metadata& metadata() const { return meta_; }
  const Graph& graph() const { return graph_; }
  Graph& graph() { return graph_; }
  const std::vector<TensorEntry>& tensors() const { return entries_; }
  const TensorEntry* find(std::string_view name) const;
  const TensorEntry* find(TensorId id) const;
  // The entry's bytes, 64-byte aligned in memory.
  std::span<const std::byte> data(const TensorEntry& e) const;
  // Recomputes the entry's checksum; throws Error POOCH_ERR_BAD_INPUT on a mismatch.
  void verify(const TensorEntry& e) const;
  bool mapped() const;

 private:
  friend PoochFile read_pooch_file(const std::string& path, const ReadOptions& opts);
  struct Storage;
  PoochFile();

  std::string path_;
  uint32_t version_ = 0;
  FileLayout layout_;
  Metadata meta_;
  Graph graph_;
  std::vector<TensorEntry> entries_;
  std::vector<int32_t> entry_of_tensor_;  // graph tensor id -> index in entries_, or -1
  std::unique_ptr<Storage> storage_;
};

// Opens and checks a .pooch file (docs/FORMAT.md "Errors"): Error
// POOCH_ERR_IO when the OS fails, POOCH_ERR_UNSUPPORTED for a newer format
// version, POOCH_ERR_BAD_INPUT naming the byte offset for anything malformed.
PoochFile read_pooch_file(const std::string& path, const ReadOptions& opts = {});

}  // namespace pooch
