// The commands rank 0 of a tensor-parallel engine sends its followers (tp_engine.h): a fixed header
// and a byte payload written and read field by field (both ends are the same binary on
// little-endian hosts; sizes are checked on read, so a short or garbled payload is an error, not a
// wild read).
#pragma once

#include <cstdint>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "miles/model.h"
#include "miles/status.h"

namespace miles::rollout::tp_wire {

// kJoinIntake / kIntake / kAdopt: direct weight intake (tp_engine.h's TpShardIntake) — join a
// weight group, receive this rank's shard of a version on a thread of its own, build it as a
// generation.
enum class Op : uint32_t {
  kInit = 1,
  kLoad,
  kForward,
  kDrop,
  kPing,
  kStop,
  kJoinIntake,
  kIntake,
  kAdopt
};
const char* op_name(Op op);

struct Header {
  uint32_t magic = 0x4D545031;  // "MTP1"
  Op op = Op::kPing;
  int64_t generation = 0;  // load / forward / drop: the weight generation
  int64_t payload_bytes = 0;
};
static_assert(sizeof(Header) == 24);

// A command is one message of kCommandBytes: the header, then the payload's first bytes (a decode
// step's whole payload); a longer payload's rest follows as a second message (kPayloadTag). One
// message per step instead of two: each costs a loopback round of Gloo's transport.
constexpr size_t kCommandBytes = 8192;
constexpr size_t kInlineBytes = kCommandBytes - sizeof(Header);
constexpr uint32_t kHeaderTag = 0x7470'0001;
constexpr uint32_t kPayloadTag = 0x7470'0002;
constexpr size_t kChecksumBytes = 32;  // an xxh3-128 in hex, in the adopt step's all-gather
// A status every rank contributes to an all-gather: code 0 ok, else the message (truncated).
struct StatusSlot {
  int32_t code = 0;
  char message[252] = {};
};
static_assert(sizeof(StatusSlot) == 256);
StatusSlot to_slot(const Status& s);
// A rank's checksums (name order) in its slot of the adopt step's all-gather: `count` slots of
// kChecksumBytes, all blank unless it holds exactly `count` of them.
std::vector<char> checksum_slots(const std::map<std::string, std::string>& sums, int64_t count);

class Writer {
 public:
  template <typename T>
  void put(const T& v) {
    const size_t at = bytes_.size();
    bytes_.resize(at + sizeof(T));
    std::memcpy(bytes_.data() + at, &v, sizeof(T));
  }
  template <typename T>
  void put_array(const T* data, int64_t n) {
    put<int64_t>(n);
    const size_t at = bytes_.size();
    bytes_.resize(at + sizeof(T) * n);
    if (n > 0) std::memcpy(bytes_.data() + at, data, sizeof(T) * n);
  }
  void put_string(const std::string& s) { put_array(s.data(), static_cast<int64_t>(s.size())); }
  std::vector<uint8_t>& bytes() { return bytes_; }

 private:
  std::vector<uint8_t> bytes_;
};

class Reader {
 public:
  explicit Reader(const std::vector<uint8_t>& bytes) : bytes_(bytes) {}
  template <typename T>
  Status get(T& v) {
    if (at_ + sizeof(T) > bytes_.size()) return short_read();
    std::memcpy(&v, bytes_.data() + at_, sizeof(T));
    at_ += sizeof(T);
    return Status::Ok();
  }
  // A count then that many elements, as a pointer into the payload (valid while it lives) when
  // T's alignment allows, copied otherwise.
  template <typename T>
  Status get_array(std::vector<T>& out) {
    int64_t n = 0;
    MILES_RETURN_IF_ERROR(get(n));
    if (n < 0 || static_cast<uint64_t>(n) > (bytes_.size() - at_) / sizeof(T)) return short_read();
    out.resize(static_cast<size_t>(n));
    if (n > 0) std::memcpy(out.data(), bytes_.data() + at_, sizeof(T) * n);
    at_ += sizeof(T) * n;
    return Status::Ok();
  }
  Status get_string(std::string& s) {
    std::vector<char> c;
    MILES_RETURN_IF_ERROR(get_array(c));
    s.assign(c.begin(), c.end());
    return Status::Ok();
  }
  bool done() const { return at_ == bytes_.size(); }

 private:
  Status short_read() const {
    return Status::Error("tensor-parallel command payload ends early (" +
                         std::to_string(bytes_.size()) + " bytes, read " + std::to_string(at_) +
                         ")");
  }
  const std::vector<uint8_t>& bytes_;
  size_t at_ = 0;
};

// A partial block copied for a forked GRPO sibling (BlockPool::copy_prefix), replayed by followers
// before the next forward.
struct BlockCopy {
  int32_t src = 0, dst = 0;
  int64_t positions = 0;
};

// One forward's inputs as a follower needs them: the batch, each span's block table (rank 0's
// PagedKvCache decides; followers keep no tables of their own) and the copies to replay first.
struct ForwardCommand {
  std::vector<BlockCopy> copies;
  std::vector<int32_t> tokens;
  std::vector<SeqSpan> seqs;
  std::vector<std::vector<int32_t>> tables;  // [seqs.size()]
  bool all_logits = false;
  std::vector<int64_t> last_rows;  // ForwardOptions::last_rows
  bool return_experts = false;
  std::vector<uint8_t> encode() const;
  static Result<ForwardCommand> decode(const std::vector<uint8_t>& bytes);
};

}  // namespace miles::rollout::tp_wire
