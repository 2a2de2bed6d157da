#include "ddp/comm/shm/segment.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include <fmt/format.h>

#include "ddp/common/error.h"

namespace ddp::comm::shm {
namespace {

// The one check of this file's system calls: the call's name, the segment and errno's text.
[[noreturn]] void fail(const char* call, const std::string& name, int error) {
  throw Error(fmt::format("shared memory {}: {} failed: {}", name, call, std::strerror(error)));
}

// Closes the descriptor when it goes: the mapping keeps the memory.
struct Fd {
  int fd;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

void* map(int fd, const std::string& name, size_t bytes) {
  void* data = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (data == MAP_FAILED) fail("mmap", name, errno);
  return data;
}

}  // namespace

Segment Segment::create(const std::string& name, size_t bytes) {
  const Fd f{::shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600)};
  if (f.fd < 0) fail("shm_open", name, errno);
  // posix_fallocate returns its error rather than setting errno.
  if (const int error = ::posix_fallocate(f.fd, 0, static_cast<off_t>(bytes)); error != 0) {
    remove(name);
    fail(fmt::format("reserving {} bytes", bytes).c_str(), name, error);
  }
  try {
    return Segment(name, map(f.fd, name, bytes), bytes);
  } catch (...) {
    remove(name);
    throw;
  }
}

Segment Segment::open(const std::string& name, size_t bytes) {
  const Fd f{::shm_open(name.c_str(), O_RDWR, 0)};
  if (f.fd < 0) fail("shm_open", name, errno);
  struct stat st {};
  if (::fstat(f.fd, &st) != 0) fail("fstat", name, errno);
  if (static_cast<size_t>(st.st_size) < bytes) {
    throw Error(fmt::format("shared memory {}: holds {} bytes, {} expected", name, st.st_size, bytes));
  }
  return Segment(name, map(f.fd, name, bytes), bytes);
}

Segment::Segment(Segment&& other) noexcept
    : name_(std::move(other.name_)),
      data_(std::exchange(other.data_, nullptr)),
      size_(std::exchange(other.size_, 0)) {}

Segment& Segment::operator=(Segment&& other) noexcept {
  if (this != &other) {
    if (data_ != nullptr) ::munmap(data_, size_);
    name_ = std::move(other.name_);
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
  }
  return *this;
}

Segment::~Segment() {
  if (data_ != nullptr) ::munmap(data_, size_);
}

void Segment::remove(const std::string& name) noexcept {
  ::shm_unlink(name.c_str());
}

}  // namespace ddp::comm::shm
