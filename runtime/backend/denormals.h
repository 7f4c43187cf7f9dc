// Denormal floats in the host kernels pooch runs.
//
// An x86 core takes a microcode assist, about a hundred cycles, for each
// arithmetic operation on a denormal (below 1.2e-38) operand or result. In
// training they arrive late and quietly: gradients and momenta shrink as a
// model fits and a cosine schedule's rate goes to zero, and a Debtags member
// spent 57% of its last epochs in the SGD update, its epochs slowing from 1.0
// to 2.5 s (docs/BENCHMARKS.md, "Denormals"). So the CPU backend's stream
// threads compute with denormals flushed to zero (FTZ: results; DAZ:
// inputs), as GPUs' fast paths and torch.set_flush_denormal(True) do, and so
// do the OpenMP teams they start and the OpenBLAS threads a backend starts
// (new threads inherit the creating thread's setting); the CUDA backend's
// host kernels (optimizer updates where paged state lives) run on such a
// worker too (handed over by the CUDA runtime's thread, which stays as it
// is), and the CUDA kernels are compiled to flush (-ftz=true), so both give
// the same bits. The host's own threads keep theirs: the library never
// changes the caller's floating-point environment.
#pragma once

namespace pooch {

// The calling thread's control word, so that it can be put back.
struct FloatMode {
  unsigned bits = 0;
};
FloatMode float_mode();
void set_float_mode(FloatMode m);

// Turns flushing on for the calling thread (x86: MXCSR's FTZ and DAZ bits;
// AArch64: FPCR.FZ; elsewhere nothing).
void flush_denormals_on_this_thread();

// Flushing on while it lives (threads started meanwhile inherit it); the
// calling thread's mode back after.
class ScopedFlushDenormals {
 public:
  ScopedFlushDenormals() : saved_(float_mode()) { flush_denormals_on_this_thread(); }
  ~ScopedFlushDenormals() { set_float_mode(saved_); }
  ScopedFlushDenormals(const ScopedFlushDenormals&) = delete;
  ScopedFlushDenormals& operator=(const ScopedFlushDenormals&) = delete;

 private:
  FloatMode saved_;
};

}  // namespace pooch
