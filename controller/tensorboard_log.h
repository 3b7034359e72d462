// TensorBoardLog: RUN_DIR/tensorboard/events.out.tfevents.*, TensorBoard's own event file format
// (TFRecord framing: length, masked CRC-32C of it, an Event message, masked CRC-32C of that),
// written natively: scalars per step, histograms, text samples.
//
// Why: practitioners watch runs in TensorBoard; the file is written by the controller as the run
// goes (flushed per step), so `tensorboard --logdir RUN_DIR/tensorboard` follows a live run. The
// messages are TensorBoard's (proto/tensorboard/event.proto), read back by its Python readers in
// the tests.
#pragma once

#include <cstdint>
#include <cstdio>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "miles/status.h"

namespace miles::controller {

// CRC-32C (Castagnoli) of the bytes, and TFRecord's masked form of it.
uint32_t crc32c(const void* data, size_t n);
uint32_t masked_crc32c(const void* data, size_t n);

// The counts of `values` in TensorBoard's histogram buckets: (limits[i - 1], limits[i]].
struct Histogram {
  std::vector<double> limits, counts;
  double min = 0, max = 0, num = 0, sum = 0, sum_squares = 0;
};
// `buckets` equal-width buckets over [min, max] (one bucket when all values are equal).
Histogram make_histogram(std::span<const double> values, int buckets = 30);

class TensorBoardLog {
 public:
  // A new event file in `dir` (created); its first record is the file version.
  static Result<std::unique_ptr<TensorBoardLog>> open(const std::string& dir);
  ~TensorBoardLog();
  Status scalar(int64_t step, const std::string& tag, double value);
  Status histogram(int64_t step, const std::string& tag, const Histogram& h);
  Status text(int64_t step, const std::string& tag, const std::string& markdown);
  Status flush();
  const std::string& path() const { return path_; }

 private:
  Status record(const std::string& event_bytes);
  std::FILE* f_ = nullptr;
  std::string path_;
};

}  // namespace miles::controller
