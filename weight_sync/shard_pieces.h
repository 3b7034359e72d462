// How a tensor's tensor-parallel shards map onto each other (tensor_parallel.h's split: rows,
// columns or replicated): the part of trainer rank k's shard (of nt) that engine rank j (of ne)
// holds. Used by the p2p transport (each engine rank gets its pieces from every trainer rank) and
// by receivers that keep only their shard of whole tensors (ne ranks, one "trainer" shard: nt = 1).
#pragma once

#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <vector>

#include "miles/status.h"
#include "miles/tensor_parallel.h"
#include "miles/weight_sync/transfer_plan.h"

namespace miles::shard_pieces {

using tensor_parallel::Split;

inline int64_t numel_of(const PlannedTensor& t) {
  return t.bytes / static_cast<int64_t>(sizeof(float));
}

// Floats of tensor t that one of `n` tensor-parallel ranks holds.
inline int64_t local_numel(const PlannedTensor& t, int n) {
  return tensor_parallel::split_of(t.name) == Split::kReplicated ? numel_of(t) : numel_of(t) / n;
}

// The shape of one of `n` ranks' shards of t.
inline std::vector<int64_t> local_shape(const PlannedTensor& t, int n) {
  std::vector<int64_t> s = t.shape;
  switch (tensor_parallel::split_of(t.name)) {
    case Split::kReplicated:
      break;
    case Split::kRows:
      s[0] /= n;
      break;
    case Split::kCols:
      s[1] /= n;
      break;
  }
  return s;
}

// `rows` runs of `len` floats, at src + i * src_stride in the trainer rank's shard and dst + i *
// dst_stride in the engine rank's. Empty (len 0) when they share nothing; a replicated tensor comes
// whole from trainer rank 0.
struct Piece {
  int64_t rows = 0, len = 0, src = 0, src_stride = 0, dst = 0, dst_stride = 0;
  int64_t floats() const { return rows * len; }
};

inline Piece piece_of(const PlannedTensor& t, int k, int nt, int j, int ne) {
  const Split split = tensor_parallel::split_of(t.name);
  if (split == Split::kReplicated) return k == 0 ? Piece{1, numel_of(t), 0, 0, 0, 0} : Piece{};
  // Rows: element ranges of the flat tensor; columns: column ranges of every row.
  const int64_t extent = split == Split::kRows ? numel_of(t) : t.shape[1];
  const int64_t rows = split == Split::kRows ? 1 : t.shape[0];
  const int64_t a0 = k * extent / nt, a1 = (k + 1) * extent / nt;
  const int64_t b0 = j * extent / ne, b1 = (j + 1) * extent / ne;
  const int64_t lo = std::max(a0, b0), hi = std::min(a1, b1);
  if (hi <= lo) return Piece{};
  return Piece{rows, hi - lo, lo - a0, extent / nt, lo - b0, extent / ne};
}

// Ok when every split tensor's split dimension divides over each of `sizes` tensor-parallel ranks
// (the pieces above assume it); else an error naming the tensor.
inline Status check_splits(const TransferPlan& plan, std::initializer_list<int> sizes) {
  for (const Bucket& b : plan.buckets)
    for (const PlannedTensor& t : b.tensors) {
      const Split split = tensor_parallel::split_of(t.name);
      if (split == Split::kReplicated) continue;
      const int64_t extent = split == Split::kRows ? t.shape[0] : t.shape[1];
      for (int n : sizes)
        if (n < 1 || extent % n != 0)
          return Status::Error("weight sync: " + t.name + " (" + std::to_string(extent) +
                               (split == Split::kRows ? " rows" : " columns") +
                               ") does not split over " + std::to_string(n) +
                               " tensor-parallel ranks");
    }
  return Status::Ok();
}

// Engine rank j's shard (of ne) of the whole tensor `full`.
inline std::vector<float> shard_of(const PlannedTensor& t, const float* full, int j, int ne) {
  std::vector<float> out(static_cast<size_t>(local_numel(t, ne)));
  const Piece p = piece_of(t, 0, 1, j, ne);
  for (int64_t r = 0; r < p.rows; ++r)
    std::copy_n(full + p.src + r * p.src_stride, p.len, out.data() + p.dst + r * p.dst_stride);
  return out;
}

}  // namespace miles::shard_pieces
