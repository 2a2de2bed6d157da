// A preloaded write(2) that is slow on the temp files of atomic writes (ddp/common/files.h):
// with LD_PRELOAD=<this library> and DDP_SLOW_WRITES_MS=ms, each write into a file whose name has
// ".tmp-" returns after ms milliseconds more, so that a test can kill ddp_train in the middle of
// a checkpoint (write_file_atomically writes 64 KiB at a time). The shipped programs know
// nothing of it.
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static int is_atomic_temp_file(int fd) {
  char link[64];
  char path[4096];
  snprintf(link, sizeof(link), "/proc/self/fd/%d", fd);
  const ssize_t n = readlink(link, path, sizeof(path) - 1);
  if (n <= 0) return 0;
  path[n] = '\0';
  return strstr(path, ".tmp-") != NULL;
}

ssize_t write(int fd, const void* buf, size_t count) {
  static ssize_t (*real_write)(int, const void*, size_t);
  if (real_write == NULL)
    real_write = (ssize_t(*)(int, const void*, size_t))dlsym(RTLD_NEXT, "write");
  const ssize_t written = real_write(fd, buf, count);
  const char* ms = getenv("DDP_SLOW_WRITES_MS");
  if (ms != NULL && written > 0 && is_atomic_temp_file(fd)) {
    const long delay = atol(ms);
    const struct timespec pause = {delay / 1000, (delay % 1000) * 1000000L};
    nanosleep(&pause, NULL);
  }
  return written;
}
