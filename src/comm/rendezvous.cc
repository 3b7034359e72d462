// join_members: set my key, wait for everyone's, and on timeout list who is missing.
#include "rendezvous.h"

namespace miles::comm::detail {

std::string ranks_text(const std::vector<int>& ranks) {
  std::string s;
  for (size_t i = 0; i < ranks.size(); ++i) s += (i ? "," : "") + std::to_string(ranks[i]);
  return s;
}

Status join_members(TcpStoreClient& store, const std::string& prefix, int rank,
                    const std::vector<int>& world_ranks, const std::string& name,
                    std::chrono::milliseconds timeout) {
  const int size = static_cast<int>(world_ranks.size());
  const std::string where = "joining group " + name + " as rank " + std::to_string(rank) + " of " +
                            std::to_string(size) + " (store " + store.address() + ", prefix \"" +
                            prefix + "\")";
  const auto joined_key = [&](int r) { return prefix + "/joined/" + std::to_string(r); };
  MILES_RETURN_IF_ERROR(store.set(joined_key(rank), "1").with_context(where));
  std::vector<std::string> keys;
  for (int r = 0; r < size; ++r) keys.push_back(joined_key(r));
  Status s = store.wait(keys, timeout);
  if (s.ok()) return s;
  std::vector<int> missing, missing_world;
  for (int r = 0; r < size; ++r) {
    auto present = store.check({joined_key(r)});
    if (present.ok() && !*present) {
      missing.push_back(r);
      missing_world.push_back(world_ranks[r]);
    }
  }
  if (missing.empty()) return s.with_context(where);
  return Status::Error(where + ": rank(s) " + ranks_text(missing) + " (world rank(s) " +
                       ranks_text(missing_world) + ") did not join within " +
                       std::to_string(timeout.count()) + " ms");
}

}  // namespace miles::comm::detail
