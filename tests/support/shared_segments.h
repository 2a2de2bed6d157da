#pragma once
// Whether memory lies in a shared-memory segment of a group (shm's allocate_buffer), for the
// worker programs: this process's mappings of /dev/shm/ddp-... (unlinked once every rank mapped
// them, so listed as "(deleted)"). Header-only: the workers do not link the test support library.

#include <cstdint>
#include <fstream>
#include <sstream>
#include <string>

namespace ddp::testing {

inline bool in_shared_segment(const void* address) {
  const auto at = reinterpret_cast<uintptr_t>(address);
  std::ifstream maps("/proc/self/maps");
  for (std::string line; std::getline(maps, line);) {
    if (line.find(" /dev/shm/ddp-") == std::string::npos) continue;
    std::istringstream range(line);  // "begin-end perms ..." in hexadecimal
    uintptr_t begin = 0;
    uintptr_t end = 0;
    char dash = 0;
    range >> std::hex >> begin >> dash >> end;
    if (at >= begin && at < end) return true;
  }
  return false;
}

}  // namespace ddp::testing
