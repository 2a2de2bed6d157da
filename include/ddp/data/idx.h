#pragma once
// The IDX format of MNIST and Fashion-MNIST, read straight from the .gz files Debian ships.

#include <cstdint>
#include <string>
#include <vector>

namespace ddp::data {

// An IDX array of unsigned bytes (type code 0x08), the only type (Fashion-)MNIST uses.
struct IdxArray {
  std::vector<int64_t> dims;
  std::vector<uint8_t> values;  // row-major, product(dims) bytes
};

// Parses an IDX image already in memory. `name` is used in error messages only.
// Checks the magic number (two zero bytes, type 0x08, rank == expected_rank), every dimension,
// and that exactly product(dims) bytes follow. Throws InputError naming `name`.
IdxArray parse_idx(const std::string& bytes, int expected_rank, const std::string& name);

// Reads a whole file, gunzipping it when it is gzip-compressed (zlib reads plain files as is).
// Throws InputError on a missing, unreadable or truncated file.
std::string read_maybe_gzip(const std::string& path);

// read_maybe_gzip + parse_idx.
IdxArray read_idx(const std::string& path, int expected_rank);

}  // namespace ddp::data
