#include "ddp/comm/store/store_protocol.h"

#include <fmt/format.h>

#include "ddp/common/error.h"

namespace ddp::comm {
namespace {

void put_u32(std::string& out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out += static_cast<char>((v >> (8 * i)) & 0xff);
}

uint32_t get_u32(const std::string& in, size_t at) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i)
    v |= static_cast<uint32_t>(static_cast<uint8_t>(in[at + i])) << (8 * i);
  return v;
}

}  // namespace

std::string encode(const StoreMessage& message) {
  std::string body;
  body += static_cast<char>(message.code);
  put_u32(body, static_cast<uint32_t>(message.fields.size()));
  for (const auto& f : message.fields) {
    put_u32(body, static_cast<uint32_t>(f.size()));
    body += f;
  }
  std::string out;
  put_u32(out, static_cast<uint32_t>(body.size()));
  return out + body;
}

std::optional<StoreMessage> decode(std::string& buffer, size_t max_bytes) {
  if (buffer.size() < 4) return std::nullopt;
  const size_t length = get_u32(buffer, 0);
  if (length > max_bytes) {
    throw InputError(fmt::format("a message of {} bytes (at most {})", length, max_bytes));
  }
  if (buffer.size() < 4 + length) return std::nullopt;
  if (length < 5) throw InputError("a message shorter than its header");
  StoreMessage m;
  m.code = static_cast<StoreOp>(static_cast<uint8_t>(buffer[4]));
  const size_t count = get_u32(buffer, 5);
  size_t at = 9;
  const size_t end = 4 + length;
  for (size_t i = 0; i < count; ++i) {
    if (end - at < 4) throw InputError("a field past the end of its message");
    const size_t size = get_u32(buffer, at);
    at += 4;
    if (end - at < size) throw InputError("a field past the end of its message");
    m.fields.push_back(buffer.substr(at, size));
    at += size;
  }
  if (at != end) throw InputError("bytes after the last field of a message");
  buffer.erase(0, end);
  return m;
}

int64_t parse_integer(const std::string& text) {
  try {
    size_t used = 0;
    const int64_t v = std::stoll(text, &used);
    if (used == text.size()) return v;
  } catch (const std::exception&) {
  }
  throw InputError(fmt::format("'{}' is not an integer", text.substr(0, 40)));
}

bool same_token(const std::string& a, const std::string& b) {
  unsigned char diff = a.size() == b.size() ? 0 : 1;
  for (size_t i = 0; i < a.size(); ++i) {
    diff |= static_cast<unsigned char>(a[i] ^ (i < b.size() ? b[i] : 0));
  }
  return diff == 0;
}

}  // namespace ddp::comm
