#pragma once
// Private: the wire protocol of the job's rendezvous store (job_store.h), as pure functions.
//
// Wire format (both directions): u32 length of what follows, u8 code, u32 count, then `count`
// fields of u32 length + bytes; integers little-endian. Numbers inside fields (timeouts, add's
// counter) are decimal text, as c10d's add stores them.

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace ddp::comm {

enum class StoreOp : uint8_t {
  kHello = 1,   // [token] -> kOk | kDenied [reason]
  kSet,         // [key, value] -> kOk
  kGet,         // [key, timeout ms] -> kOk [value] | kTimeout (waits for the key)
  kAdd,         // [key, delta] -> kOk [new value]   (decimal text, as c10d's add)
  kCompareSet,  // [key, expected, desired] -> kOk [value now]
  kCheck,       // [keys...] -> kOk ["1" | "0"]
  kWait,        // [timeout ms, keys...] -> kOk | kTimeout
  kDelete,      // [key] -> kOk ["1" | "0"]
  kNumKeys,     // [] -> kOk [count]
  // Replies.
  kOk = 100,
  kDenied,
  kTimeout,
  kError,  // [message]: a malformed request
};

struct StoreMessage {
  StoreOp code = StoreOp::kOk;
  std::vector<std::string> fields;
};

// The largest message before the token (no room to flood the server) and after it (values are
// ids and addresses).
constexpr size_t kMaxHelloBytes = 4096;
constexpr size_t kMaxMessageBytes = 64 << 20;

// The bytes of `message`, length prefix included.
std::string encode(const StoreMessage& message);

// Takes one whole message off the front of `buffer`: nullopt while it is incomplete. Throws
// InputError for a malformed one or one longer than `max_bytes` (the connection is then
// dropped).
std::optional<StoreMessage> decode(std::string& buffer, size_t max_bytes);

// The integer a field holds as decimal text; throws InputError for anything else.
int64_t parse_integer(const std::string& text);

// Equal strings, in a time that does not depend on where they differ.
bool same_token(const std::string& a, const std::string& b);

}  // namespace ddp::comm
