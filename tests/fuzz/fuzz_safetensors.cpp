// libFuzzer target: the safetensors reader (formats/safetensors.cpp), which
// reads Hugging Face checkpoints: parse_buffer over the whole input, and for
// an accepted header the Reader over the same bytes as a file, reading every
// tensor (and as float32 where its dtype converts). Accepted tensors must lie
// inside the data section and hold exactly their elements' bytes.
#include "formats/safetensors.h"
#include "runtime/core/error.h"
#include "tests/fuzz/fuzz_input.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  namespace st = pooch::safetensors;
  st::Header h;
  try {
    h = st::parse_buffer(data, size, "fuzz.safetensors");
  } catch (const pooch::Error&) {
    return 0;
  }
  for (const st::TensorInfo& t : h.tensors) {
    if (t.end < t.begin || t.end > h.data_bytes || h.data_start + h.data_bytes > size)
      pooch_fuzz::finding("parse_buffer accepted tensor '" + t.name + "' outside the data");
    if (t.bytes() != t.elements() * st::dtype_size(t.dtype))
      pooch_fuzz::finding("parse_buffer accepted tensor '" + t.name +
                          "' whose bytes do not match its shape");
  }
  const std::string path = pooch_fuzz::input_path(".safetensors");
  pooch_fuzz::write_input(path, data, size);
  try {
    const st::Reader r(path);
    std::vector<uint8_t> buf;
    for (const st::TensorInfo& t : r.header().tensors) {
      buf.resize(t.bytes());
      r.read(t, buf.data());
      try {
        (void)r.read_f32(t);
      } catch (const pooch::Error&) {
      }
    }
  } catch (const pooch::Error& e) {
    pooch_fuzz::finding(std::string("the Reader refused a file parse_buffer accepted: ") +
                        e.what());
  }
  return 0;
}
