// GroupBatch (group_batch.h).
#include "controller/group_batch.h"

#include <algorithm>

namespace miles::controller {

GroupBatch::GroupBatch(GroupRunner& runner, const PromptData& data, int64_t first_position,
                       int64_t need, int64_t launch_size, bool filter_zero_variance)
    : runner_(runner),
      data_(data),
      next_position_(first_position),
      need_(need),
      launch_size_(std::max(launch_size, need)),
      filter_(filter_zero_variance),
      start_(std::chrono::steady_clock::now()) {
  launch(launch_size_);
}

GroupBatch::~GroupBatch() {
  cancel_ = true;
  for (auto& s : slots_)
    if (s->thread.joinable()) s->thread.join();
}

void GroupBatch::launch(int64_t count) {
  for (int64_t i = 0; i < count; ++i) {
    auto slot = std::make_unique<Slot>();
    slot->position = next_position_++;
    const Prompt* prompt = &data_.at(slot->position);
    Slot* s = slot.get();
    slots_.push_back(std::move(slot));
    s->thread = std::thread([this, s, prompt] {
      auto r = runner_.run(s->position, *prompt, cancel_);
      std::lock_guard<std::mutex> lock(mu_);
      s->result.emplace(std::move(r));
      cv_.notify_all();
    });
  }
}

Result<BatchOutcome> GroupBatch::wait() {
  BatchOutcome out;
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    // Scan the completed prefix in position order.
    std::vector<size_t> pass, fail;
    size_t i = 0;
    for (; i < slots_.size() && slots_[i]->result; ++i) {
      const auto& r = *slots_[i]->result;
      if (!r.ok()) {
        cancel_ = true;
        Status err = r.status();
        lock.unlock();
        return err;
      }
      (filter_ && r->zero_variance() ? fail : pass).push_back(i);
      if (static_cast<int64_t>(pass.size()) == need_) break;
    }
    const int64_t launched = static_cast<int64_t>(slots_.size());
    const bool fill = static_cast<int64_t>(pass.size()) < need_ && i == slots_.size() &&
                      launched >= 8 * need_ &&
                      static_cast<int64_t>(pass.size() + fail.size()) >= need_;
    if (static_cast<int64_t>(pass.size()) == need_ || fill) {
      std::vector<size_t> take = pass;
      if (fill) {
        out.filled_with_filtered = true;
        take.insert(take.end(), fail.begin(), fail.end());
        std::sort(take.begin(), take.end());
        take.resize(need_);
        for (size_t k : take) out.without_signal += slots_[k]->result->value().zero_variance();
      }
      out.seconds =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
      cancel_ = true;  // the surplus still in flight
      const size_t last = take.back();
      // Groups dropped for lack of signal: those before the last one taken (filling takes
      // every group that passed, so there every finished group without signal not taken).
      out.filtered = fill ? static_cast<int64_t>(fail.size()) - out.without_signal : 0;
      if (!fill)
        for (size_t k = 0; k <= last; ++k)
          if (std::find(take.begin(), take.end(), k) == take.end()) ++out.filtered;
      for (size_t k = last + 1; k < slots_.size(); ++k) out.cancelled += !slots_[k]->result;
      for (size_t k : take) out.groups.push_back(std::move(slots_[k]->result->value()));
      out.launched = launched;
      out.next_position = next_position_;
      return out;
    }
    if (i == slots_.size()) {
      // Everything launched has finished and too few passed: launch more.
      lock.unlock();
      launch(launch_size_);
      lock.lock();
      continue;
    }
    cv_.wait(lock);
  }
}

}  // namespace miles::controller
