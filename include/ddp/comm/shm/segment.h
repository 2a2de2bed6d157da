#pragma once
// A POSIX shared-memory segment (shm_open, in /dev/shm), mapped into this process.
//
// Note [Nothing left in /dev/shm]
// A segment is created by one rank, opened by the others, and unlinked as soon as every rank has
// mapped it: from then on it has no name, and the kernel frees it when the last process that maps
// it ends, however it ends (a SIGKILL included). Before that, the name is known to every rank
// before it exists (rank 0 proposes it in the set-up's first collective), and each rank removes
// it when its set-up ends, succeeded or failed: a rank lost anywhere in the set-up makes the
// others' next collective fail, and they remove it then. A name is left only when every rank
// of the group dies between its creation and the end of the set-up.

#include <cstddef>
#include <string>

namespace ddp::comm::shm {

class Segment {
 public:
  // Creates `name` ("/ddp-...") of `bytes` bytes, zero-filled, and maps it. Its memory is
  // reserved now (posix_fallocate): a /dev/shm too small fails here, with ENOSPC in the Error,
  // rather than with a SIGBUS at the first touch of a page it cannot hold. Fails when `name`
  // exists.
  static Segment create(const std::string& name, size_t bytes);
  // Maps the existing `name`, which must hold at least `bytes` bytes.
  static Segment open(const std::string& name, size_t bytes);

  Segment(Segment&& other) noexcept;
  Segment& operator=(Segment&& other) noexcept;
  Segment(const Segment&) = delete;
  Segment& operator=(const Segment&) = delete;
  ~Segment();  // unmaps (the name stays until remove())

  // Removes `name` if it is there, not the memory: whoever maps it keeps it. Any rank may, once
  // every rank has mapped it or never will; for the end of a set-up, failed ones included, so a
  // name already gone is no error, and there is none to report (it cannot throw).
  static void remove(const std::string& name) noexcept;

  void* data() const { return data_; }
  size_t size() const { return size_; }
  const std::string& name() const { return name_; }

 private:
  Segment(std::string name, void* data, size_t size) : name_(std::move(name)), data_(data), size_(size) {}
  std::string name_;
  void* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace ddp::comm::shm
