// Where an element of a 4-D tensor lies in each Layout (kernel_abi.h), and
// the copies between a blocked layout and the plain one: what the session
// does where a weight leaves or enters the arena (reads, writes, the
// initial values, checkpoints), and what tests compare through.
#pragma once
#include <cstdint>

#include "kernel_abi.h"

namespace pooch::kern {

// Whether a 4-D tensor of this shape can lie in `layout`: its blocked
// dimensions are multiples of 16 (plain: always).
inline bool fits_layout(Layout layout, const int64_t* shape, int ndim) {
  switch (layout) {
    case Layout::plain:
      return true;
    case Layout::nchw16c:
      return ndim == 4 && shape[1] > 0 && shape[1] % 16 == 0;
    case Layout::oihw16i16o:
      return ndim == 4 && shape[0] > 0 && shape[1] > 0 && shape[0] % 16 == 0 && shape[1] % 16 == 0;
  }
  return false;
}

// The offset in `layout` of element (a, b, c, d) of a 4-D tensor of shape s.
inline int64_t layout_offset(Layout layout, const int64_t* s, int64_t a, int64_t b, int64_t c,
                             int64_t d) {
  const int64_t plane = s[2] * s[3], p = c * s[3] + d;
  switch (layout) {
    case Layout::nchw16c:  // [N][C/16][H][W][16c]
      return ((a * (s[1] / 16) + b / 16) * plane + p) * 16 + b % 16;
    case Layout::oihw16i16o:  // [O/16][I/16][KH][KW][16i][16o]
      return (((a / 16) * (s[1] / 16) + b / 16) * plane + p) * 256 + (b % 16) * 16 + a % 16;
    case Layout::plain:
      break;
  }
  return (a * s[1] + b) * plane + p;
}

// Copies a 4-D f32 tensor of shape s from `from` (plain, or in `layout` when
// `to_plain`) to `to` (in `layout`, or plain); the two must not overlap.
inline void relayout(Layout layout, const int64_t* s, const float* from, float* to, bool to_plain) {
  for (int64_t a = 0; a < s[0]; ++a)
    for (int64_t b = 0; b < s[1]; ++b)
      for (int64_t c = 0; c < s[2]; ++c)
        for (int64_t d = 0; d < s[3]; ++d) {
          const int64_t plain = ((a * s[1] + b) * s[2] + c) * s[3] + d;
          const int64_t blocked = layout_offset(layout, s, a, b, c, d);
          to[to_plain ? plain : blocked] = from[to_plain ? blocked : plain];
        }
}

}  // namespace pooch::kern
