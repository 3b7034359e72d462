// Encoding of the tensor-parallel engine's commands (tp_wire.h).
#include "rollout/tp_wire.h"

#include <algorithm>

namespace miles::rollout::tp_wire {

const char* op_name(Op op) {
  switch (op) {
    case Op::kInit:
      return "init";
    case Op::kLoad:
      return "load";
    case Op::kForward:
      return "forward";
    case Op::kDrop:
      return "drop";
    case Op::kPing:
      return "ping";
    case Op::kStop:
      return "stop";
    case Op::kJoinIntake:
      return "join weight intake";
    case Op::kIntake:
      return "weight intake";
    case Op::kAdopt:
      return "adopt received weights";
  }
  return "unknown";
}

std::vector<char> checksum_slots(const std::map<std::string, std::string>& sums, int64_t count) {
  std::vector<char> out(static_cast<size_t>(count) * kChecksumBytes, 0);
  if (static_cast<int64_t>(sums.size()) != count) return out;
  size_t i = 0;
  for (const auto& [name, sum] : sums)
    std::memcpy(out.data() + kChecksumBytes * i++, sum.data(),
                std::min(sum.size(), kChecksumBytes));
  return out;
}

StatusSlot to_slot(const Status& s) {
  StatusSlot slot;
  if (s.ok()) return slot;
  slot.code = 1;
  const std::string& m = s.message();
  std::copy_n(m.data(), std::min(m.size(), sizeof(slot.message) - 1), slot.message);
  return slot;
}

std::vector<uint8_t> ForwardCommand::encode() const {
  Writer w;
  w.put_array(copies.data(), static_cast<int64_t>(copies.size()));
  w.put_array(tokens.data(), static_cast<int64_t>(tokens.size()));
  w.put_array(seqs.data(), static_cast<int64_t>(seqs.size()));
  for (const auto& t : tables) w.put_array(t.data(), static_cast<int64_t>(t.size()));
  w.put<uint8_t>(all_logits ? 1 : 0);
  w.put_array(last_rows.data(), static_cast<int64_t>(last_rows.size()));
  w.put<uint8_t>(return_experts ? 1 : 0);
  return std::move(w.bytes());
}

Result<ForwardCommand> ForwardCommand::decode(const std::vector<uint8_t>& bytes) {
  ForwardCommand c;
  Reader r(bytes);
  MILES_RETURN_IF_ERROR(r.get_array(c.copies));
  MILES_RETURN_IF_ERROR(r.get_array(c.tokens));
  MILES_RETURN_IF_ERROR(r.get_array(c.seqs));
  c.tables.resize(c.seqs.size());
  for (auto& t : c.tables) MILES_RETURN_IF_ERROR(r.get_array(t));
  uint8_t a = 0, e = 0;
  MILES_RETURN_IF_ERROR(r.get(a));
  MILES_RETURN_IF_ERROR(r.get_array(c.last_rows));
  MILES_RETURN_IF_ERROR(r.get(e));
  if (!r.done()) return Status::Error("forward command: trailing bytes");
  c.all_logits = a != 0;
  c.return_experts = e != 0;
  return c;
}

}  // namespace miles::rollout::tp_wire
