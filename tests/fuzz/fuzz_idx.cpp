// The IDX reader (Fashion-MNIST's format) on arbitrary bytes, as images (rank 3) and labels (1).
#include <cstddef>
#include <cstdint>
#include <string>

#include "ddp/common/error.h"
#include "ddp/data/idx.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string bytes(reinterpret_cast<const char*>(data), size);
  for (int rank : {1, 3}) {
    try {
      ddp::data::parse_idx(bytes, rank, "fuzz");
    } catch (const ddp::InputError&) {
    }
  }
  return 0;
}
