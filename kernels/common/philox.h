// Counter-based random numbers (Philox4x32-10, Salmon et al. SC'11). A value
// depends only on (seed, step, op key, element index), never on the order in
// which threads ask, so a recomputed dropout gives the same mask as the first
// forward, and the CPU and CUDA backends give the same masks.
#pragma once
#include <cstdint>

#if defined(__CUDACC__)
#define POOCH_HD __host__ __device__ __forceinline__
#else
#define POOCH_HD inline
#endif

namespace pooch::kern {

struct Philox4 {
  uint32_t v[4];
};

// One of Philox4x32-10's rounds on a counter (c0..c3) under key (k0, k1);
// the caller bumps the key by kPhiloxW0/W1 between rounds. Shared by the
// one-block form below and the CPU dropout's 16-lane form.
constexpr uint32_t kPhiloxM0 = 0xD2511F53u, kPhiloxM1 = 0xCD9E8D57u;
constexpr uint32_t kPhiloxW0 = 0x9E3779B9u, kPhiloxW1 = 0xBB67AE85u;
POOCH_HD void philox_round(uint32_t& c0, uint32_t& c1, uint32_t& c2, uint32_t& c3, uint32_t k0,
                           uint32_t k1) {
  const uint64_t p0 = static_cast<uint64_t>(kPhiloxM0) * c0;
  const uint64_t p1 = static_cast<uint64_t>(kPhiloxM1) * c2;
  c0 = static_cast<uint32_t>(p1 >> 32) ^ c1 ^ k0;
  c1 = static_cast<uint32_t>(p1);
  c2 = static_cast<uint32_t>(p0 >> 32) ^ c3 ^ k1;
  c3 = static_cast<uint32_t>(p0);
}

POOCH_HD Philox4 philox4x32_10(uint32_t c0, uint32_t c1, uint32_t c2, uint32_t c3, uint32_t k0,
                               uint32_t k1) {
  for (int r = 0; r < 10; ++r) {
    philox_round(c0, c1, c2, c3, k0, k1);
    k0 += kPhiloxW0;
    k1 += kPhiloxW1;
  }
  return Philox4{{c0, c1, c2, c3}};
}

// Uniform in [0, 1) with 24 random bits, for element `i` of the op keyed by
// `op_key` at optimizer step `step`, in a session seeded with `seed`.
POOCH_HD float philox_uniform(uint64_t seed, uint64_t step, uint32_t op_key, uint64_t i) {
  const uint64_t block = i >> 2;
  const Philox4 r = philox4x32_10(static_cast<uint32_t>(block), static_cast<uint32_t>(block >> 32),
                                  op_key, static_cast<uint32_t>(step), static_cast<uint32_t>(seed),
                                  static_cast<uint32_t>(seed >> 32));
  return static_cast<float>(r.v[i & 3] >> 8) * (1.0f / 16777216.0f);
}

}  // namespace pooch::kern
