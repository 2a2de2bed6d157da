#pragma once
// Files that survive a crash: a reader sees either the old or the new contents of a file, never a
// mix, whatever happens to the writer (kill -9, power loss after the rename returned).

#include <string>
#include <string_view>

namespace ddp {

// Writes `contents` to `path` atomically: into a temp file beside it (`<path>.tmp-<pid>`), fsync,
// rename over `path`, fsync the directory. Temp files a killed writer left for `path` are removed
// first. Throws Error naming the path and the system's reason; `path` is then unchanged.
void write_file_atomically(const std::string& path, std::string_view contents);

// The same for a file written in parts (one too large to hold in memory): the parts go into the
// temp file, and commit() makes it `path`. Destroyed without commit() (an error on the way), the
// temp file is removed and `path` is unchanged.
class AtomicFile {
 public:
  explicit AtomicFile(std::string path);  // creates the temp file; Error naming it
  ~AtomicFile();
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;

  void append(std::string_view data);  // Error naming the temp file (a full disk said as such)
  void commit();                       // fsync, rename over `path`, fsync the directory

 private:
  std::string path_, temp_;
  int fd_ = -1;
};

// Makes `link` a second name of the file `target` (a hard link; a copy where the file system has
// none), atomically replacing whatever `link` was. Throws Error naming the paths.
void link_atomically(const std::string& target, const std::string& link);

// Throws InputError naming `dir` when a file cannot be created in it (read-only file system,
// permissions): checked before a run starts rather than at its first checkpoint.
void check_writable_dir(const std::string& dir);

// The whole file. Throws InputError naming the path when it cannot be read.
std::string read_file(const std::string& path);

}  // namespace ddp
