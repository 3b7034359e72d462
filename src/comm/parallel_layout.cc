// ParallelLayout: rank <-> (dp, pp, tp) arithmetic and the "dp=2,pp=1,tp=2" syntax.
#include "miles/parallel_layout.h"

#include <charconv>
#include <cstdint>
#include <limits>

#include "miles/check.h"

namespace miles {

namespace {

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

}  // namespace

Result<ParallelLayout> ParallelLayout::create(int dp, int pp, int tp) {
  if (dp <= 0 || pp <= 0 || tp <= 0) {
    return Status::Error("parallel layout: sizes must be positive, got dp=" + std::to_string(dp) +
                         ", pp=" + std::to_string(pp) + ", tp=" + std::to_string(tp));
  }
  const int64_t world = int64_t{dp} * pp * tp;
  if (world > std::numeric_limits<int>::max()) {
    return Status::Error("parallel layout: world size dp*pp*tp = " + std::to_string(world) +
                         " is too large");
  }
  return ParallelLayout(dp, pp, tp);
}

Result<ParallelLayout> ParallelLayout::parse(std::string_view spec) {
  const std::string context = "parallel layout \"" + std::string(spec) + "\"";
  if (trim(spec).empty()) {
    return Status::Error(context + ": empty; expected e.g. \"dp=2,pp=1,tp=2\"");
  }
  int sizes[3] = {1, 1, 1};  // dp, pp, tp
  bool seen[3] = {false, false, false};
  static constexpr std::string_view kKeys[3] = {"dp", "pp", "tp"};
  size_t start = 0;
  while (start <= spec.size()) {
    size_t comma = spec.find(',', start);
    if (comma == std::string_view::npos) comma = spec.size();
    const std::string_view token = trim(spec.substr(start, comma - start));
    start = comma + 1;
    if (token.empty()) return Status::Error(context + ": empty entry between commas");
    const size_t eq = token.find('=');
    if (eq == std::string_view::npos) {
      return Status::Error(context + ": entry \"" + std::string(token) +
                           "\" is not key=value (keys: dp, pp, tp)");
    }
    const std::string_view key = trim(token.substr(0, eq));
    const std::string_view value = trim(token.substr(eq + 1));
    int k = -1;
    for (int i = 0; i < 3; ++i) {
      if (key == kKeys[i]) k = i;
    }
    if (k < 0) {
      return Status::Error(context + ": unknown key \"" + std::string(key) +
                           "\" (keys: dp, pp, tp)");
    }
    if (seen[k]) return Status::Error(context + ": key \"" + std::string(key) + "\" given twice");
    seen[k] = true;
    int v = 0;
    const auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), v);
    if (value.empty() || ec != std::errc() || end != value.data() + value.size()) {
      return Status::Error(context + ": value of " + std::string(key) + " (\"" +
                           std::string(value) + "\") is not an integer");
    }
    if (v <= 0) {
      return Status::Error(context + ": " + std::string(key) + " must be positive, got " +
                           std::to_string(v));
    }
    sizes[k] = v;
    if (comma == spec.size()) break;
  }
  auto layout = create(sizes[0], sizes[1], sizes[2]);
  if (!layout.ok()) return layout.status().with_context(context);
  return layout;
}

Status ParallelLayout::check_world_size(int world_size) const {
  if (world_size == this->world_size()) return Status::Ok();
  return Status::Error("parallel layout " + to_string() +
                       " needs dp*pp*tp = " + std::to_string(this->world_size()) +
                       " ranks, but the world has " + std::to_string(world_size));
}

RankCoord ParallelLayout::coord(int rank) const {
  MILES_CHECK(rank >= 0 && rank < world_size(), "rank out of range of the parallel layout");
  RankCoord c;
  c.tp = rank % tp_;
  c.dp = (rank / tp_) % dp_;
  c.pp = rank / (tp_ * dp_);
  return c;
}

int ParallelLayout::rank_of(RankCoord c) const {
  MILES_CHECK(c.dp >= 0 && c.dp < dp_ && c.pp >= 0 && c.pp < pp_ && c.tp >= 0 && c.tp < tp_,
              "coordinate out of range of the parallel layout");
  return (c.pp * dp_ + c.dp) * tp_ + c.tp;
}

std::vector<int> ParallelLayout::tp_group(int rank) const {
  RankCoord c = coord(rank);
  std::vector<int> g;
  for (c.tp = 0; c.tp < tp_; ++c.tp) g.push_back(rank_of(c));
  return g;
}

std::vector<int> ParallelLayout::dp_group(int rank) const {
  RankCoord c = coord(rank);
  std::vector<int> g;
  for (c.dp = 0; c.dp < dp_; ++c.dp) g.push_back(rank_of(c));
  return g;
}

std::vector<int> ParallelLayout::pp_group(int rank) const {
  RankCoord c = coord(rank);
  std::vector<int> g;
  for (c.pp = 0; c.pp < pp_; ++c.pp) g.push_back(rank_of(c));
  return g;
}

namespace {

template <typename GroupOf>
std::vector<std::vector<int>> all_groups(int world, GroupOf group_of) {
  std::vector<std::vector<int>> groups;
  std::vector<bool> covered(world, false);
  for (int r = 0; r < world; ++r) {
    if (covered[r]) continue;
    groups.push_back(group_of(r));
    for (int m : groups.back()) covered[m] = true;
  }
  return groups;
}

}  // namespace

std::vector<std::vector<int>> ParallelLayout::all_tp_groups() const {
  return all_groups(world_size(), [this](int r) { return tp_group(r); });
}
std::vector<std::vector<int>> ParallelLayout::all_dp_groups() const {
  return all_groups(world_size(), [this](int r) { return dp_group(r); });
}
std::vector<std::vector<int>> ParallelLayout::all_pp_groups() const {
  return all_groups(world_size(), [this](int r) { return pp_group(r); });
}

int ParallelLayout::stage_leader(int stage) const {
  MILES_CHECK(stage >= 0 && stage < pp_, "pipeline stage out of range");
  return rank_of(RankCoord{.dp = 0, .pp = stage, .tp = 0});
}

std::optional<int> ParallelLayout::next_stage_rank(int rank) const {
  RankCoord c = coord(rank);
  if (c.pp + 1 >= pp_) return std::nullopt;
  ++c.pp;
  return rank_of(c);
}

std::optional<int> ParallelLayout::prev_stage_rank(int rank) const {
  RankCoord c = coord(rank);
  if (c.pp == 0) return std::nullopt;
  --c.pp;
  return rank_of(c);
}

std::string ParallelLayout::to_string() const {
  return "dp=" + std::to_string(dp_) + ",pp=" + std::to_string(pp_) + ",tp=" + std::to_string(tp_);
}

}  // namespace miles
