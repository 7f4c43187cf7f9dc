// POOCH_VEC_CLONES: a loop's function compiled three times, for AVX-512
// (x86-64-v4), AVX2 (x86-64-v3) and the baseline, the copy for the CPU it
// runs on chosen when the library loads. The build targets the baseline, so
// without it a hot loop runs in 4-float SSE registers on every machine. The
// AVX copies may contract a multiply and an add into one FMA (one rounding
// where the baseline rounds twice; GCC contracts in C++), so a clone's last
// bits can differ from machine to machine, never from run to run on one,
// except where the code writes its fused multiply-adds out (the optimizer
// updates: kernels/common/float_ops.h).
#pragma once

// No clones under a sanitizer: the clones' ifunc resolver runs while the
// program is relocated, before the sanitizer's runtime is up, and an
// instrumented resolver crashes there (seen with ThreadSanitizer).
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && \
    !defined(__SANITIZE_THREAD__) && !defined(__SANITIZE_ADDRESS__)
#define POOCH_VEC_CLONES \
  __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
// Whether this CPU runs the x86-64-v4 (AVX-512) clones: for code inside a
// clone that pays only there. The clones share one preprocessed source, so
// __AVX512F__ cannot tell them apart.
// (__builtin_cpu_init first: a dynamic initialiser may run before libgcc's.)
inline const bool kRunsAvx512Clones = [] {
  __builtin_cpu_init();
  return __builtin_cpu_supports("x86-64-v4") != 0;
}();
#else
#define POOCH_VEC_CLONES
inline constexpr bool kRunsAvx512Clones = false;
#endif
