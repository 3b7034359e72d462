// encode_batch / decode_batch (batch_wire.h): little-endian counts and raw arrays.
#include "controller/batch_wire.h"

#include <cstring>

namespace miles::controller {

namespace {

template <typename T>
void put(std::vector<uint8_t>& out, const std::vector<T>& v) {
  const uint64_t n = v.size();
  const auto* p = reinterpret_cast<const uint8_t*>(&n);
  out.insert(out.end(), p, p + sizeof n);
  const auto* d = reinterpret_cast<const uint8_t*>(v.data());
  out.insert(out.end(), d, d + n * sizeof(T));
}

struct Reader {
  const std::vector<uint8_t>& b;
  size_t pos = 0;
  template <typename T>
  bool get(std::vector<T>& v) {
    uint64_t n = 0;
    if (b.size() - pos < sizeof n) return false;
    std::memcpy(&n, b.data() + pos, sizeof n);
    pos += sizeof n;
    if (n > (b.size() - pos) / sizeof(T)) return false;
    v.resize(n);
    if (n > 0) std::memcpy(v.data(), b.data() + pos, n * sizeof(T));  // v.data() may be null
    pos += n * sizeof(T);
    return true;
  }
};

}  // namespace

std::vector<uint8_t> encode_batch(const std::vector<TrainSample>& samples,
                                  const std::vector<RlSampleData>& data) {
  std::vector<uint8_t> out;
  put(out, std::vector<uint64_t>{samples.size()});
  for (size_t i = 0; i < samples.size(); ++i) {
    const TrainSample& s = samples[i];
    const RlSampleData& d = data[i];
    put(out, s.tokens);
    put(out, std::vector<int64_t>{s.response_length});
    put(out, s.loss_mask);
    put(out, s.routed_experts);
    put(out, d.old_logp);
    put(out, d.ref_logp);
    put(out, d.rollout_logp);
    put(out, d.advantages);
  }
  return out;
}

Status decode_batch(const std::vector<uint8_t>& bytes, std::vector<TrainSample>* samples,
                    std::vector<RlSampleData>* data) {
  Reader r{bytes};
  std::vector<uint64_t> n;
  if (!r.get(n) || n.size() != 1) return Status::Error("batch bytes: no sample count");
  samples->assign(n[0], {});
  data->assign(n[0], {});
  for (uint64_t i = 0; i < n[0]; ++i) {
    TrainSample& s = (*samples)[i];
    RlSampleData& d = (*data)[i];
    std::vector<int64_t> len;
    if (!r.get(s.tokens) || !r.get(len) || len.size() != 1 || !r.get(s.loss_mask) ||
        !r.get(s.routed_experts) || !r.get(d.old_logp) || !r.get(d.ref_logp) ||
        !r.get(d.rollout_logp) || !r.get(d.advantages))
      return Status::Error("batch bytes: sample " + std::to_string(i) + " is truncated");
    s.response_length = len[0];
  }
  if (r.pos != bytes.size()) return Status::Error("batch bytes: trailing data");
  return Status::Ok();
}

}  // namespace miles::controller
