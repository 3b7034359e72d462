// WeightSender / WeightReceiver over broadcast, p2p and disk-delta (weight_sync.h).
#include <cstring>

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
  Result<ReceivedWeights> receive(int64_t v) override {
    if (current_version_ >= 0 && v > current_version_) {
      WeightSet next = current_;
      MILES_RETURN_IF_ERROR(reader_.advance(next, current_version_, v));
      current_ = std::move(next);
    } else {
      MILES_ASSIGN_OR_RETURN(current_, reader_.load(v));
    }
    current_version_ = v;
    ReceivedWeights out;
    out.version = v;
    for (const NamedTensor& t : current_) {
      if (t.dtype != "F32") return Status::Error("disk-delta tensor " + t.name + " is " + t.dtype);
      std::vector<float>& dst = out.tensors[t.name];
      dst.resize(t.bytes.size() / sizeof(float));
      std::memcpy(dst.data(), t.bytes.data(), t.bytes.size());
      out.shapes[t.name] = t.shape;
      out.checksums[t.name] = xxh3_128_hex(t.bytes.data(), t.bytes.size());
    }
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
