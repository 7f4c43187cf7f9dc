// Errors inside the library are C++ exceptions carrying a public status code;
// the C API boundary (runtime/api) catches every one and turns it into a
// pooch_status plus a message, so nothing ever escapes to the host program.
#pragma once
#include <cstddef>
#include <stdexcept>
#include <string>

#include "pooch/pooch.h"

namespace pooch {

class Error : public std::runtime_error {
 public:
  Error(pooch_status code, std::string message)
      : std::runtime_error(std::move(message)), code_(code) {}
  pooch_status code() const { return code_; }

 private:
  pooch_status code_;
};

// A plan larger than the device budget, with the smallest budget it found
// that would do (bytes), so that a caller trying several ways can name the
// nearest.
class OutOfBudget : public Error {
 public:
  OutOfBudget(size_t needed_bytes, std::string message)
      : Error(POOCH_ERR_OUT_OF_BUDGET, std::move(message)), needed_bytes_(needed_bytes) {}
  size_t needed_bytes() const { return needed_bytes_; }

 private:
  size_t needed_bytes_;
};

// An internal invariant that does not hold: a bug in pooch, never the user's input.
#define POOCH_CHECK(cond, ...)                                                                 \
  do {                                                                                         \
    if (!(cond))                                                                               \
      throw ::pooch::Error(POOCH_ERR_INTERNAL, std::string("internal check failed at ") +      \
                                                   __FILE__ + ":" + std::to_string(__LINE__) + \
                                                   ": " #cond " " __VA_ARGS__);                \
  } while (0)

}  // namespace pooch
