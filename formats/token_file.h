// Token streams for language models: llm.c's token files (a header of 256
// little-endian int32 — magic 20240520, version 1, token count — then the
// tokens as uint16), and plain text read byte by byte (a byte-level
// vocabulary of 256, for models trained from scratch). `.npy` arrays of token
// ids are read by pooch-run (apps/npy) and handed over as int32.
// docs/FORMAT.md "Token files" has the layout and the checks.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace pooch::tokens {

inline constexpr int32_t kLlmcMagic = 20240520;  // GPT-2 tokens, as llm.c's dev/data scripts write
inline constexpr int32_t kLlmcVersion = 1;       // uint16 tokens
inline constexpr size_t kLlmcHeaderInts = 256;
inline constexpr size_t kLlmcHeaderBytes = kLlmcHeaderInts * 4;

// Parses an llm.c token file held in memory (the fuzz target calls this).
// Every problem is Error(POOCH_ERR_BAD_INPUT) naming `source`, the field and
// its byte offset: the size, magic (bytes 0-3), version (4-7), token count
// (8-11) and that the file holds exactly that many tokens.
std::vector<int32_t> parse_llmc(const void* data, size_t size, const std::string& source);

// Reads an llm.c token file (mapped, not copied twice).
std::vector<int32_t> read_llmc(const std::string& path);

// Writes tokens as an llm.c token file, atomically. Tokens must lie in
// [0, 65535] (Error POOCH_ERR_INVALID_ARG naming the first that does not).
void write_llmc(const std::string& path, const std::vector<int32_t>& tokens);

// A text file's bytes as tokens 0..255 (the byte-level vocabulary).
std::vector<int32_t> read_bytes(const std::string& path);

// True when the file starts with the llm.c magic (for choosing a reader by content).
bool looks_like_llmc(const std::string& path);

// Error(POOCH_ERR_BAD_INPUT) naming `source`, the position and value of the
// first token outside [0, vocab), so that a data file made for another
// vocabulary is refused before training starts.
void check_vocab(const std::vector<int32_t>& tokens, int64_t vocab, const std::string& source);

}  // namespace pooch::tokens
