// The checkpoint and weights loader (the zip container and our pickle interpreter) on arbitrary
// bytes, then the state-dict extraction a load performs.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "ddp/common/error.h"
#include "ddp/train/pt_file.h"
#include "ddp/train/state_dict.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    const auto value =
        ddp::train::parse_pt(std::string_view(reinterpret_cast<const char*>(data), size), "fuzz.pt");
    ddp::train::state_dict_from(value, "fuzz.pt");
  } catch (const ddp::InputError&) {
  }
  return 0;
}
