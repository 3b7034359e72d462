// WeightSender / WeightReceiver over broadcast, p2p and disk-delta (weight_sync.h).
#include <cstring>
#include <memory>

#include "miles/comm.h"
#include "miles/weight_sync/disk_delta.h"
#include "miles/weight_sync/weight_sync.h"

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
  // advance() changes the current set only when every version applied and verified. The result
  // lends the current set (it stays the base of the next delta) instead of copying it: the reader
  // verified every tensor's bytes against the manifest, so the set is `verified`. A set still lent
  // when the next version comes is copied first and left as it was (copy on write); the engine
  // drops its set once its model is built, so a following engine never copies.
  Result<ReceivedWeights> receive(int64_t v) override {
    std::vector<std::string> verified;  // each tensor's hash, as checked against the manifest
    if (current_ && v > current_version_) {
      if (current_.use_count() > 1) current_ = std::make_shared<WeightSet>(*current_);
      MILES_RETURN_IF_ERROR(reader_.advance(*current_, current_version_, v, &verified));
    } else {
      MILES_ASSIGN_OR_RETURN(WeightSet loaded, reader_.load(v, &verified));
      current_ = std::make_shared<WeightSet>(std::move(loaded));
    }
    current_version_ = v;
    ReceivedWeights out;
    out.version = v;
    out.lent_owner = current_;
    for (size_t i = 0; i < current_->size(); ++i) {
      const NamedTensor& t = (*current_)[i];
      if (t.dtype != "F32") return Status::Error("disk-delta tensor " + t.name + " is " + t.dtype);
      out.lent[t.name] = {reinterpret_cast<const float*>(t.bytes.data()),
                          t.bytes.size() / sizeof(float)};
      out.checksums[t.name] = verified[i];
      out.shapes[t.name] = t.shape;
    }
    out.verified = true;
    MILES_RETURN_IF_ERROR(verify_received_weights(out, plan_));
    return out;
  }

 private:
  DiskDeltaReader reader_;
  TransferPlan plan_;
  std::shared_ptr<WeightSet> current_;  // null before the first version
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
