// Reading and writing extreme multi-label data sets in the formats of the
// Extreme Classification Repository, plus a binary cache so that a large set
// is parsed from text once.
//
// Formats (all indices 0-based):
//  - bag of words: header `N F L` (points, features, labels), then one line
//    per point `l1,l2,... f:v f:v ...`. A point without labels starts with a
//    space or directly with a feature `f:v`; a blank line is a point with no
//    labels and no features.
//  - split files: features `X_Xf.txt` (header `rows cols`, then per line
//    `i:v i:v ...`) and labels `X_Y.txt` (header `rows labels`, same form; the
//    values are checked to be numbers and otherwise ignored).
//  - dense features: a NumPy .npy file (format 1.0, 2.0 or 3.0; dtype '<f4'
//    or '<f8'; C order; 2-D rows x features) with labels from a split label
//    file.
// CRLF line endings, a UTF-8 byte order mark and trailing spaces or tabs are
// accepted. Within a line, labels are sorted and duplicates dropped (a label
// set has no order or multiplicity); features are sorted by index and a
// repeated index has its values summed (as scipy's sum_duplicates does).
// Anything else malformed is a pooch::Error with POOCH_ERR_BAD_INPUT whose
// message names the file, line and column, what was expected and what to do;
// failing to open or read a file is POOCH_ERR_IO. The readers never trust a
// count in a file to size an allocation beyond what the file's length allows.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>

#include "formats/xmc_data.h"

namespace pooch {

// ---- Parsing bytes already in memory; `name` is used in error messages. ----

XmcDataset parse_xmc_bow(std::string_view text, const std::string& name);
XmcDataset parse_xmc_split(std::string_view features_text, const std::string& features_name,
                           std::string_view labels_text, const std::string& labels_name);
// Dense features from the bytes of a .npy file, labels from split-label text.
XmcDataset parse_xmc_npy(std::string_view npy_bytes, const std::string& npy_name,
                         std::string_view labels_text, const std::string& labels_name);

// ---- Reading files, without any cache. ----

XmcDataset read_xmc_bow(const std::string& path);
// The features file may be split text (X_Xf.txt) or a .npy file; which one is
// told by its first bytes, not its name.
XmcDataset read_xmc_split(const std::string& features_path, const std::string& labels_path);

// ---- Writing. Files are written atomically (temporary file, fsync, rename). ----

// Values are written in the shortest form that reads back to the same float,
// so write-then-read is bit-exact. The data set must have sparse features.
std::string format_xmc_bow(const XmcDataset& d);
void write_xmc_bow(const std::string& path, const XmcDataset& d);
void write_xmc_split(const std::string& features_path, const std::string& labels_path,
                     const XmcDataset& d);
// The dense features of `d` as a '<f4' .npy file (format 1.0).
void write_npy(const std::string& path, const XmcDataset& d);
// The label half of a split pair alone (used with write_npy).
void write_xmc_split_labels(const std::string& labels_path, const XmcDataset& d);

// Checks the CSR invariants of `d` (pointer arrays monotone and consistent,
// indices in range, values finite, dense block sized rows x dense_dim).
// Returns "" when they hold, otherwise what is wrong.
std::string xmc_check(const XmcDataset& d);

// ---- Loading through the binary cache. ----

struct LoadOptions {
  bool use_cache = true;    // read a valid cache file when one exists
  bool write_cache = true;  // write the cache after parsing text
  // Where the cache lives; "" means beside the (features) file, with
  // ".pcache" appended to its name.
  std::string cache_path;
};

struct LoadInfo {
  bool from_cache = false;     // the data came from the cache, not the text
  bool cache_written = false;  // a new cache was written by this load
  std::string cache_path;
  // Why an existing cache was not used, or why writing one failed; "" when
  // neither happened. A cache problem never fails a load: the text is read.
  std::string cache_note;
};

// The cache is keyed by each source file's size, modification time and an
// xxh3 hash of its first and last 64 KiB, so editing, replacing or touching a
// source invalidates it. A cache that is corrupt, truncated, from another
// version or inconsistent in any way is ignored and rewritten.
XmcDataset load_xmc(const std::string& path, const LoadOptions& opts = {},
                    LoadInfo* info = nullptr);
XmcDataset load_xmc_split(const std::string& features_path, const std::string& labels_path,
                          const LoadOptions& opts = {}, LoadInfo* info = nullptr);

}  // namespace pooch
