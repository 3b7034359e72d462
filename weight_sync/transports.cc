// WeightSender / WeightReceiver over broadcast, p2p and disk-delta (weight_sync.h).
#include <cstring>

#include "miles/comm.h"
#include "miles/weight_sync/disk_delta.h"
#include "miles/weight_sync/weight_sync.h"
#include "weight_sync/for_each_tensor.h"

namespace miles {

namespace {

class BroadcastSender final : public WeightSender {
 public:
  BroadcastSender(Communicator& g, TransferPlan p, BroadcastOptions o)
      : g_(g), plan_(std::move(p)), o_(std::move(o)) {}
  Status send(int64_t v, const TensorSource& src) override {
    return broadcast_weights(g_, plan_, v, src, nullptr, o_);
  }

 private:
  Communicator& g_;
  TransferPlan plan_;
  BroadcastOptions o_;
};

class BroadcastReceiver final : public WeightReceiver {
 public:
  BroadcastReceiver(Communicator& g, TransferPlan p, BroadcastOptions o)
      : g_(g), plan_(std::move(p)), o_(std::move(o)) {}
  Result<ReceivedWeights> receive(int64_t v) override {
    ReceivedWeights w;
    MILES_RETURN_IF_ERROR(broadcast_weights(g_, plan_, v, nullptr, &w, o_));
    MILES_RETURN_IF_ERROR(verify_received_weights(w, plan_));
    return w;
  }

 private:
  Communicator& g_;
  TransferPlan plan_;
  BroadcastOptions o_;
};

class P2pSender final : public WeightSender {
 public:
  P2pSender(Communicator& w, TransferPlan p, P2pRoles r) : w_(w), plan_(std::move(p)), r_(r) {}
  Status send(int64_t v, const TensorSource& src) override {
    return p2p_send_weights(w_, plan_, v, src, r_);
  }

 private:
  Communicator& w_;
  TransferPlan plan_;
  P2pRoles r_;
};

class P2pReceiver final : public WeightReceiver {
 public:
  P2pReceiver(Communicator& w, TransferPlan p, P2pRoles r) : w_(w), plan_(std::move(p)), r_(r) {}
  Result<ReceivedWeights> receive(int64_t v) override {
    ReceivedWeights out;
    MILES_RETURN_IF_ERROR(p2p_receive_weights(w_, plan_, v, r_, &out));
    MILES_RETURN_IF_ERROR(verify_received_weights(out, plan_));
    return out;
  }

 private:
  Communicator& w_;
  TransferPlan plan_;
  P2pRoles r_;
};

class DiskDeltaSender final : public WeightSender {
 public:
  DiskDeltaSender(const std::string& dir, TransferPlan p, DiskDeltaOptions o)
      : writer_(dir, std::move(o)), plan_(std::move(p)) {}
  Status send(int64_t v, const TensorSource& src) override {
    WeightSet set;
    for (const Bucket& b : plan_.buckets)
      for (const PlannedTensor& t : b.tensors) {
        std::span<const float> x = src(t.name);
        NamedTensor n{t.name, "F32", t.shape, {}};
        n.bytes.resize(x.size_bytes());
        std::memcpy(n.bytes.data(), x.data(), x.size_bytes());
        set.push_back(std::move(n));
      }
    return writer_.publish(v, set).status();
  }

 private:
  DiskDeltaWriter writer_;
  TransferPlan plan_;
};

class DiskDeltaReceiver final : public WeightReceiver {
 public:
  DiskDeltaReceiver(const std::string& dir, TransferPlan p) : reader_(dir), plan_(std::move(p)) {}
  // advance() changes current_ only when every version applied and verified; the engine gets its
  // own copy (current_ stays the base of the next delta), each tensor copied and hashed on the
  // machine's cores: the hash of the copy's bytes must be the one the reader verified against the
  // manifest (so `verified`: verify_received_weights needs no second pass).
  Result<ReceivedWeights> receive(int64_t v) override {
    std::vector<std::string> verified;  // each tensor's hash, as checked against the manifest
    if (current_version_ >= 0 && v > current_version_) {
      MILES_RETURN_IF_ERROR(reader_.advance(current_, current_version_, v, &verified));
    } else {
      MILES_ASSIGN_OR_RETURN(current_, reader_.load(v, &verified));
    }
    current_version_ = v;
    ReceivedWeights out;
    out.version = v;
    std::vector<std::vector<float>*> dst;
    std::vector<std::string*> sums;
    for (const NamedTensor& t : current_) {
      if (t.dtype != "F32") return Status::Error("disk-delta tensor " + t.name + " is " + t.dtype);
      dst.push_back(&out.tensors[t.name]);
      sums.push_back(&out.checksums[t.name]);
      out.shapes[t.name] = t.shape;
    }
    MILES_RETURN_IF_ERROR(weight_sync_detail::for_each_tensor(current_.size(), [&](size_t i) {
      const std::vector<uint8_t>& bytes = current_[i].bytes;
      dst[i]->resize(bytes.size() / sizeof(float));
      std::memcpy(dst[i]->data(), bytes.data(), bytes.size());
      *sums[i] = xxh3_128_hex(dst[i]->data(), bytes.size());
      if (*sums[i] != verified[i])
        return Status::Error("disk-delta tensor " + current_[i].name + ": its copy hashes to " +
                             *sums[i] + ", the version's manifest says " + verified[i]);
      return Status::Ok();
    }));
    out.verified = true;
    MILES_RETURN_IF_ERROR(verify_received_weights(out, plan_));
    return out;
  }

 private:
  DiskDeltaReader reader_;
  TransferPlan plan_;
  WeightSet current_;
  int64_t current_version_ = -1;
};

}  // namespace

std::unique_ptr<WeightSender> make_broadcast_sender(Communicator& g, TransferPlan p,
                                                    BroadcastOptions o) {
  return std::make_unique<BroadcastSender>(g, std::move(p), std::move(o));
}
std::unique_ptr<WeightReceiver> make_broadcast_receiver(Communicator& g, TransferPlan p,
                                                        BroadcastOptions o) {
  return std::make_unique<BroadcastReceiver>(g, std::move(p), std::move(o));
}
std::unique_ptr<WeightSender> make_p2p_sender(Communicator& w, TransferPlan p, P2pRoles r) {
  return std::make_unique<P2pSender>(w, std::move(p), r);
}
std::unique_ptr<WeightReceiver> make_p2p_receiver(Communicator& w, TransferPlan p, P2pRoles r) {
  return std::make_unique<P2pReceiver>(w, std::move(p), r);
}
std::unique_ptr<WeightSender> make_disk_delta_sender(const std::string& dir, TransferPlan p,
                                                    DiskDeltaOptions options) {
  return std::make_unique<DiskDeltaSender>(dir, std::move(p), std::move(options));
}
std::unique_ptr<WeightReceiver> make_disk_delta_receiver(const std::string& dir, TransferPlan p) {
  return std::make_unique<DiskDeltaReceiver>(dir, std::move(p));
}

}  // namespace miles
