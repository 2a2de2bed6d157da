#include "ddp/common/files.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "ddp/common/error.h"

namespace ddp {
namespace {

namespace fs = std::filesystem;

std::string system_reason(int err) {
  return std::strerror(err);
}

// Closes a descriptor on scope exit.
struct Fd {
  int fd = -1;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

// Removes `<name>.tmp-*` beside `path`: what a writer killed in the middle left behind.
void remove_stale_temp_files(const fs::path& path) {
  const std::string stem = path.filename().string() + ".tmp-";
  std::error_code ec;
  for (const auto& entry :
       fs::directory_iterator(path.parent_path().empty() ? "." : path.parent_path(), ec)) {
    if (entry.path().filename().string().rfind(stem, 0) == 0) fs::remove(entry.path(), ec);
  }
}

// In chunks of 64 KiB: a test (tests/support/slow_writes.c, preloaded) slows each write(2)
// down to kill a writer in the middle of a file.
void write_all(int fd, std::string_view contents, const std::string& temp) {
  constexpr size_t kChunk = 64 * 1024;
  size_t done = 0;
  while (done < contents.size()) {
    const size_t n = std::min(kChunk, contents.size() - done);
    const ssize_t written = ::write(fd, contents.data() + done, n);
    if (written < 0) {
      if (errno == EINTR) continue;
      const bool full = errno == ENOSPC || errno == EDQUOT || errno == EFBIG;
      throw Error(fmt::format("{}: write failed: {}{}", temp, system_reason(errno),
                              full ? " (the disk, a quota or the file size limit is full; the "
                                     "file it was to replace is untouched)"
                                   : ""));
    }
    done += static_cast<size_t>(written);
  }
}

}  // namespace

AtomicFile::AtomicFile(std::string path)
    : path_(std::move(path)), temp_(fmt::format("{}.tmp-{}", path_, ::getpid())) {
  remove_stale_temp_files(fs::path(path_));
  fd_ = ::open(temp_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd_ < 0) throw Error(fmt::format("{}: cannot create: {}", temp_, system_reason(errno)));
}

AtomicFile::~AtomicFile() {
  if (fd_ < 0) return;  // committed
  ::close(fd_);
  ::unlink(temp_.c_str());
}

void AtomicFile::append(std::string_view data) {
  write_all(fd_, data, temp_);
}

void AtomicFile::commit() {
  // The data must be on disk before the rename makes it the file: else a crash could leave
  // `path` renamed but empty.
  if (::fsync(fd_) != 0) {
    throw Error(fmt::format("{}: fsync failed: {}", temp_, system_reason(errno)));
  }
  if (std::rename(temp_.c_str(), path_.c_str()) != 0) {
    throw Error(fmt::format("{}: cannot rename to {}: {}", temp_, path_, system_reason(errno)));
  }
  ::close(fd_);
  fd_ = -1;
  // The rename itself is durable only once the directory is synced.
  const fs::path dir =
      fs::path(path_).parent_path().empty() ? fs::path(".") : fs::path(path_).parent_path();
  Fd dir_fd{::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC)};
  if (dir_fd.fd >= 0) ::fsync(dir_fd.fd);
}

void write_file_atomically(const std::string& path, std::string_view contents) {
  AtomicFile file(path);
  file.append(contents);
  file.commit();
}

void link_atomically(const std::string& target, const std::string& link) {
  const std::string temp = fmt::format("{}.tmp-{}", link, ::getpid());
  ::unlink(temp.c_str());
  if (::link(target.c_str(), temp.c_str()) != 0) {
    write_file_atomically(link, read_file(target));
    return;
  }
  if (std::rename(temp.c_str(), link.c_str()) != 0) {
    const int err = errno;
    ::unlink(temp.c_str());
    throw Error(fmt::format("{}: cannot rename to {}: {}", temp, link, system_reason(err)));
  }
}

void check_writable_dir(const std::string& dir) {
  const std::string probe = fmt::format("{}/.ddp-write-test-{}", dir, ::getpid());
  Fd file{::open(probe.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644)};
  if (file.fd < 0) {
    throw InputError(fmt::format("output dir '{}': not writable: {}", dir, system_reason(errno)));
  }
  ::unlink(probe.c_str());
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    throw InputError(fmt::format("{}: cannot open: {}", path, system_reason(errno)));
  }
  std::error_code ec;
  const std::uintmax_t size = std::filesystem::file_size(path, ec);
  if (ec || size == 0) {  // a size not known ahead (/proc's files say 0): read to the end
    std::ostringstream contents;
    contents << in.rdbuf();
    if (in.bad()) throw InputError(fmt::format("{}: read failed", path));
    return contents.str();
  }
  // One allocation and one copy: a stream's doubling buffer copied a 26 MB file three times.
  std::string contents(static_cast<size_t>(size), '\0');
  in.read(contents.data(), static_cast<std::streamsize>(size));
  if (in.bad()) throw InputError(fmt::format("{}: read failed", path));
  contents.resize(static_cast<size_t>(in.gcount()));  // shorter if it shrank meanwhile
  return contents;
}

}  // namespace ddp
