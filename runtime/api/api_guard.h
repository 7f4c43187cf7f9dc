// Shared by the C API's source files: run a call with every exception turned
// into a status and the thread's last-error message (pooch_api.cpp).
#pragma once
#include <cstring>
#include <functional>

#include "pooch/pooch.h"

namespace pooch::api {
pooch_status run_guarded(const std::function<void()>& f);
pooch_status fail_arg(const char* msg);  // POOCH_ERR_INVALID_ARG with `msg`

// An enum field of a caller's struct as the integer it holds. A C caller can
// store any int there, and loading it as the enum type is undefined behaviour
// for a value outside the enumerators' range (UBSan: "not a valid value for
// type"), so it is read as an int and checked before use.
template <class E>
int raw_enum(const E& field) {
  static_assert(sizeof(E) == sizeof(int), "a C enum is int-sized");
  int v;
  std::memcpy(&v, &field, sizeof v);
  return v;
}
}  // namespace pooch::api
