#include "ddp/data/idx.h"

#include <fmt/format.h>
#include <zlib.h>
#ifdef DDP_HAVE_LIBDEFLATE
#include <libdeflate.h>
#endif

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <limits>
#include <memory>

#include "ddp/common/error.h"
#include "ddp/common/files.h"

namespace ddp::data {
namespace {

constexpr uint8_t kTypeUnsignedByte = 0x08;
// Larger dimensions are not an image data set but a corrupt header; refuse before allocating.
constexpr int64_t kMaxElements = int64_t{1} << 33;

uint32_t read_be32(const std::string& bytes, size_t offset) {
  auto b = [&](size_t i) { return static_cast<uint32_t>(static_cast<uint8_t>(bytes[offset + i])); };
  return (b(0) << 24) | (b(1) << 16) | (b(2) << 8) | b(3);
}

// The uncompressed size, so that reading takes one allocation (a 47 MB image file read through
// a doubling string spent as long in copies as in zlib): a plain file's size, or for gzip the
// trailer's ISIZE (the size modulo 2^32 of the last member; only a hint, the string grows past it).
// A corrupt trailer may claim 4 GiB: the hint stops at 1 GiB, so that it never allocates for it.
size_t uncompressed_size_hint(const std::string& path) {
  constexpr size_t kMaxHint = size_t{1} << 30;
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  const std::streamoff size = in.tellg();
  unsigned char magic[2] = {0, 0};
  in.seekg(0);
  in.read(reinterpret_cast<char*>(magic), 2);
  if (!in || size < 18 || magic[0] != 0x1f || magic[1] != 0x8b) {
    return size > 0 ? static_cast<size_t>(size) : 0;
  }
  unsigned char trailer[4];
  in.seekg(size - 4);
  in.read(reinterpret_cast<char*>(trailer), 4);
  if (!in) return 0;
  const size_t isize = size_t{trailer[0]} | (size_t{trailer[1]} << 8) |
                      (size_t{trailer[2]} << 16) | (size_t{trailer[3]} << 24);
  return std::min(isize, kMaxHint);
}

// The header's dimensions, each checked, and the header's size in bytes.
std::vector<int64_t> parse_header(const std::string& bytes, int expected_rank,
                                  const std::string& name, size_t* header_bytes) {
  if (bytes.size() < 4) {
    throw InputError(fmt::format(
        "{}: not an IDX file: {} bytes, shorter than the 4-byte magic number", name, bytes.size()));
  }
  const uint32_t magic = read_be32(bytes, 0);
  const auto type = static_cast<uint8_t>(bytes[2]);
  const int rank = static_cast<uint8_t>(bytes[3]);
  if (bytes[0] != 0 || bytes[1] != 0 || type != kTypeUnsignedByte || rank != expected_rank) {
    throw InputError(fmt::format(
        "{}: wrong IDX magic number 0x{:08x}, expected 0x{:08x} (unsigned bytes, {} dimensions)",
        name, magic, (uint32_t{kTypeUnsignedByte} << 8) | static_cast<uint32_t>(expected_rank),
        expected_rank));
  }
  const size_t header = 4 + 4 * static_cast<size_t>(rank);
  if (bytes.size() < header) {
    throw InputError(
        fmt::format("{}: truncated IDX header: {} bytes, expected {}", name, bytes.size(), header));
  }
  std::vector<int64_t> dims;
  int64_t count = 1;
  for (int d = 0; d < rank; ++d) {
    const int64_t dim = read_be32(bytes, 4 + 4 * static_cast<size_t>(d));
    if (dim <= 0) {
      throw InputError(
          fmt::format("{}: IDX dimension {} is {}, expected a positive size", name, d, dim));
    }
    if (dim > kMaxElements / count) {  // divided, not multiplied: the product may overflow
      throw InputError(fmt::format("{}: IDX dimensions {} x .. x {} exceed {} elements", name,
                                   dims.empty() ? dim : dims.front(), dim, kMaxElements));
    }
    count *= dim;
    dims.push_back(dim);
  }
  *header_bytes = header;
  return dims;
}

// The items of `dims` that a read of at most `max_items` (0: all) keeps.
int64_t items_kept(const std::vector<int64_t>& dims, int64_t max_items) {
  return max_items > 0 && max_items < dims.front() ? max_items : dims.front();
}

int64_t item_bytes(const std::vector<int64_t>& dims) {
  int64_t bytes = 1;
  for (size_t d = 1; d < dims.size(); ++d) bytes *= dims[d];
  return bytes;
}

}  // namespace

IdxArray parse_idx(const std::string& bytes, int expected_rank, const std::string& name,
                   int64_t max_items) {
  size_t header = 0;
  IdxArray out;
  out.dims = parse_header(bytes, expected_rank, name, &header);
  out.items = items_kept(out.dims, max_items);
  const auto all = static_cast<size_t>(out.dims.front() * item_bytes(out.dims));
  const auto kept = static_cast<size_t>(out.items * item_bytes(out.dims));
  const size_t payload = bytes.size() - header;
  if (kept == all ? payload != all : payload < kept) {
    throw InputError(fmt::format(
        "{}: IDX data has {} bytes, {} need {}{}", name, payload,
        kept == all ? "the header's dimensions" : fmt::format("its first {} items", out.items),
        kept, payload < kept ? " (truncated)" : ""));
  }
  const auto begin = bytes.begin() + static_cast<std::ptrdiff_t>(header);
  out.values.assign(begin, begin + static_cast<std::ptrdiff_t>(kept));
  return out;
}

#ifdef DDP_HAVE_LIBDEFLATE
// Note [Whole gzip files through libdeflate]
// A whole file is gunzipped by libdeflate, which inflates about 3x as fast as zlib on the 2-core
// machine of docs/benchmarks.md (Fashion-MNIST's 47 MB of training images: 0.13 CPU s against
// 0.41 for zcat): a third of a worker's start-up before its first step, which an elastic job's
// replacement spends while the survivors train. libdeflate takes the whole input and needs room
// for the whole output, so a read of the first bytes only streams through zlib instead.
std::string gunzip_whole(const std::string& path, const std::string& compressed) {
  // Deflate never expands more than 1032:1: a trailer claiming more is no allocation's measure.
  constexpr size_t kMaxRatio = 1032;
  std::unique_ptr<libdeflate_decompressor, void (*)(libdeflate_decompressor*)> inflater(
      libdeflate_alloc_decompressor(), libdeflate_free_decompressor);
  if (!inflater) throw std::bad_alloc();
  std::string out;
  size_t in_at = 0, out_at = 0;
  // The trailer's ISIZE, read from the bytes in memory (uncompressed_size_hint's, without a
  // second open of the file).
  const auto tail = [&](size_t i) {
    return size_t{static_cast<uint8_t>(compressed[compressed.size() - 4 + i])};
  };
  const size_t isize = compressed.size() < 18
                           ? 0
                           : tail(0) | (tail(1) << 8) | (tail(2) << 16) | (tail(3) << 24);
  const size_t hint = std::min(isize, compressed.size() * kMaxRatio);
  // One gzip member a pass (a file may hold several, one after another, as zlib reads them);
  // bytes after the last member that start no other are ignored, as zlib ignores them.
  while (compressed.size() - in_at >= 2 && static_cast<uint8_t>(compressed[in_at]) == 0x1f &&
         static_cast<uint8_t>(compressed[in_at + 1]) == 0x8b) {
    for (size_t room = std::max<size_t>(hint, 1 << 16);; room *= 2) {
      out.resize(out_at + room);
      size_t in_used = 0, out_used = 0;
      const libdeflate_result r = libdeflate_gzip_decompress_ex(
          inflater.get(), compressed.data() + in_at, compressed.size() - in_at, out.data() + out_at,
          room, &in_used, &out_used);
      if (r == LIBDEFLATE_SUCCESS) {
        in_at += in_used;
        out_at += out_used;
        break;
      }
      if (r != LIBDEFLATE_INSUFFICIENT_SPACE) {
        throw InputError(fmt::format("{}: corrupt or truncated gzip data (libdeflate: {})", path,
                                     r == LIBDEFLATE_BAD_DATA ? "bad data" : "short output"));
      }
    }
  }
  out.resize(out_at);
  return out;
}
#endif

std::string read_maybe_gzip(const std::string& path, size_t limit) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec)) {
    throw InputError(fmt::format("{}: no such file", path));
  }
#ifdef DDP_HAVE_LIBDEFLATE
  if (limit == 0) {
    std::string bytes = read_file(path);
    const bool gzip = bytes.size() >= 2 && static_cast<uint8_t>(bytes[0]) == 0x1f &&
                      static_cast<uint8_t>(bytes[1]) == 0x8b;
    return gzip ? gunzip_whole(path, bytes) : bytes;
  }
#endif
  gzFile file = gzopen(path.c_str(), "rb");
  if (file == nullptr) throw InputError(fmt::format("{}: cannot open for reading", path));
  const size_t wanted = limit > 0 ? limit : std::numeric_limits<size_t>::max();
  std::string out;
  out.reserve(std::min(uncompressed_size_hint(path), wanted));
  char buffer[1 << 16];
  while (out.size() < wanted) {
    const auto ask = static_cast<unsigned>(std::min(sizeof(buffer), wanted - out.size()));
    const int n = gzread(file, buffer, ask);
    if (n > 0) out.append(buffer, static_cast<size_t>(n));
    if (n < static_cast<int>(ask)) {
      int errnum = Z_OK;
      const char* message = gzerror(file, &errnum);
      // zlib reports a gzip stream cut short as Z_BUF_ERROR ("unexpected end of file").
      if (n < 0 || (errnum != Z_OK && errnum != Z_STREAM_END)) {
        std::string why = message != nullptr ? message : "read error";
        gzclose(file);
        throw InputError(fmt::format("{}: corrupt or truncated gzip data: {}", path, why));
      }
      if (n == 0 || gzeof(file)) break;
    }
  }
  gzclose(file);
  return out;
}

IdxArray read_idx(const std::string& path, int expected_rank, int64_t max_items) {
  size_t limit = 0;
  if (max_items > 0) {
    // The header first, for the bytes that the first max_items items take.
    size_t header = 0;
    const std::string head = read_maybe_gzip(path, 4 + 4 * static_cast<size_t>(expected_rank));
    const auto dims = parse_header(head, expected_rank, path, &header);
    if (max_items < dims.front()) {
      limit = header + static_cast<size_t>(max_items * item_bytes(dims));
    }
  }
  return parse_idx(read_maybe_gzip(path, limit), expected_rank, path, max_items);
}

}  // namespace ddp::data
