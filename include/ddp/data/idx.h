#pragma once
// The IDX format of MNIST and Fashion-MNIST, read straight from the .gz files Debian ships.

#include <cstdint>
#include <string>
#include <vector>

namespace ddp::data {

// An IDX array of unsigned bytes (type code 0x08), the only type (Fashion-)MNIST uses.
struct IdxArray {
  std::vector<int64_t> dims;    // the file's header: dims[0] items of product(dims[1..]) bytes
  int64_t items = 0;            // the items read: dims[0], or the first max_items of them
  std::vector<uint8_t> values;  // row-major, items x product(dims[1..]) bytes
};

// Parses an IDX image already in memory. `name` is used in error messages only.
// Checks the magic number (two zero bytes, type 0x08, rank == expected_rank) and every dimension;
// then that exactly product(dims) bytes follow, or with `max_items` > 0 below dims[0], that the
// first max_items items do (bytes past them are neither kept nor checked). Throws InputError
// naming `name`.
IdxArray parse_idx(const std::string& bytes, int expected_rank, const std::string& name,
                   int64_t max_items = 0);

// Reads a file, gunzipping it when it is gzip-compressed (zlib reads plain files as is): the
// whole of it, or its first `limit` bytes where `limit` > 0 (all there is where it holds fewer:
// parse_idx names that). Throws InputError on a missing or unreadable file, and on gzip data that
// is corrupt or cut short before the end or before `limit` bytes.
std::string read_maybe_gzip(const std::string& path, size_t limit = 0);

// read_maybe_gzip + parse_idx, reading only the bytes of the first `max_items` items where
// `max_items` > 0: a run on a subset does not gunzip the 47 MB of Fashion-MNIST's training images.
IdxArray read_idx(const std::string& path, int expected_rank, int64_t max_items = 0);

}  // namespace ddp::data
