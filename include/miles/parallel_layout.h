// ParallelLayout: the rank grid of data, pipeline and tensor parallelism.
//
// Why: every parallel component (tensor-parallel layers, the pipeline schedule, gradient reduction)
// asks the same questions — which ranks share my tensor-parallel group, which rank holds the next
// stage — and must get the same answers on every process. One value object answers them; it is
// created once from the config and passed by reference (no globals), like picotron's grid.
//
// Rank order (Megatron's default "tp-dp-pp"): tp varies fastest, then dp, then pp slowest:
//
//     rank = pp_idx * (dp * tp) + dp_idx * tp + tp_idx
//
// So a tensor-parallel group is a run of tp consecutive ranks (the ranks most likely to share a
// host), a pipeline stage is a contiguous block of dp * tp ranks, and stage s starts at rank s * dp
// * tp. Example dp=2, pp=2, tp=2 (8 ranks):
//
//     stage 0: dp0 = {0, 1}, dp1 = {2, 3}      tp groups {0,1} {2,3} {4,5} {6,7}
//     stage 1: dp0 = {4, 5}, dp1 = {6, 7}      dp groups {0,2} {1,3} {4,6} {5,7}
//                                              pp groups {0,4} {1,5} {2,6} {3,7}
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "miles/status.h"

namespace miles {

// A rank's position in the grid; each index is in [0, size of that dimension).
struct RankCoord {
  int dp = 0;
  int pp = 0;
  int tp = 0;
  bool operator==(const RankCoord&) const = default;
};

class ParallelLayout {
 public:
  // dp = pp = tp = 1: a single process.
  ParallelLayout() = default;

  // Errors when a size is not positive or the world size overflows int.
  static Result<ParallelLayout> create(int dp, int pp, int tp);
  // "dp=2,pp=1,tp=2": comma-separated key=value pairs, keys dp / pp / tp in any order, each at most
  // once, missing keys mean 1; spaces around tokens are ignored. Errors name the offending token.
  static Result<ParallelLayout> parse(std::string_view spec);

  int dp() const { return dp_; }
  int pp() const { return pp_; }
  int tp() const { return tp_; }
  int world_size() const { return dp_ * pp_ * tp_; }

  // Error unless world_size() == world_size (e.g. the number of launched processes).
  Status check_world_size(int world_size) const;

  // note: call only with 0 <= rank < world_size() (checked).
  RankCoord coord(int rank) const;
  // note: call only with in-range coordinates (checked).
  int rank_of(RankCoord c) const;

  // The ranks sharing `rank`'s group, ascending (so a rank's index in the list is its group rank,
  // which equals its coordinate in that dimension).
  std::vector<int> tp_group(int rank) const;  // same dp, pp; tp = 0..tp-1
  std::vector<int> dp_group(int rank) const;  // same tp, pp; dp = 0..dp-1
  std::vector<int> pp_group(int rank) const;  // same dp, tp; pp = 0..pp-1

  // Every group of one kind, in ascending order of their first rank (each rank appears in exactly
  // one).
  std::vector<std::vector<int>> all_tp_groups() const;
  std::vector<std::vector<int>> all_dp_groups() const;
  std::vector<std::vector<int>> all_pp_groups() const;

  // The (dp=0, tp=0) rank of pipeline stage `stage` (its first rank): where a stage reports
  // metrics.
  int stage_leader(int stage) const;
  bool is_first_stage(int rank) const { return coord(rank).pp == 0; }
  bool is_last_stage(int rank) const { return coord(rank).pp == pp_ - 1; }
  // The same (dp, tp) rank on the next / previous stage; nullopt on the last / first stage.
  std::optional<int> next_stage_rank(int rank) const;
  std::optional<int> prev_stage_rank(int rank) const;

  // "dp=2,pp=1,tp=2" (parse(to_string()) round-trips).
  std::string to_string() const;

  bool operator==(const ParallelLayout&) const = default;

 private:
  ParallelLayout(int dp, int pp, int tp) : dp_(dp), pp_(pp), tp_(tp) {}
  int dp_ = 1;
  int pp_ = 1;
  int tp_ = 1;
};

}  // namespace miles
