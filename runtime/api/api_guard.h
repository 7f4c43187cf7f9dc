// Shared by the C API's source files: run a call with every exception turned
// into a status and the thread's last-error message (pooch_api.cpp).
#pragma once
#include <functional>

#include "pooch/pooch.h"

namespace pooch::api {
pooch_status run_guarded(const std::function<void()>& f);
pooch_status fail_arg(const char* msg);  // POOCH_ERR_INVALID_ARG with `msg`
}  // namespace pooch::api
