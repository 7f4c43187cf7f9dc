#include "denormals.h"

#if defined(__x86_64__) || defined(__i386__)
#include <xmmintrin.h>
#endif
#include <cstdint>

namespace pooch {

#if defined(__x86_64__) || defined(__i386__)
namespace {
constexpr unsigned kFtz = 0x8000;  // MXCSR bit 15: flush denormal results to zero
constexpr unsigned kDaz = 0x0040;  // MXCSR bit 6: read denormal inputs as zero
}  // namespace

FloatMode float_mode() {
  return {_mm_getcsr()};
}
void set_float_mode(FloatMode m) {
  _mm_setcsr(m.bits);
}
void flush_denormals_on_this_thread() {
  _mm_setcsr(_mm_getcsr() | kFtz | kDaz);
}
#elif defined(__aarch64__)
namespace {
constexpr uint64_t kFz = uint64_t{1} << 24;  // FPCR.FZ: flush denormals to zero
uint64_t read_fpcr() {
  uint64_t v;
  asm volatile("mrs %0, fpcr" : "=r"(v));
  return v;
}
void write_fpcr(uint64_t v) {
  asm volatile("msr fpcr, %0" : : "r"(v));
}
}  // namespace

FloatMode float_mode() {
  return {static_cast<unsigned>(read_fpcr())};
}
void set_float_mode(FloatMode m) {
  write_fpcr(m.bits);
}
void flush_denormals_on_this_thread() {
  write_fpcr(read_fpcr() | kFz);
}
#else
FloatMode float_mode() {
  return {};
}
void set_float_mode(FloatMode) {}
void flush_denormals_on_this_thread() {}
#endif

}  // namespace pooch
