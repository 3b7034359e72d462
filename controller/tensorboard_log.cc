// TensorBoardLog (tensorboard_log.h).
#include "controller/tensorboard_log.h"

#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>

#include "tensorboard/event.pb.h"

namespace miles::controller {

namespace {

constexpr int32_t kDtString = 7;  // tensorboard DataType DT_STRING
constexpr int32_t kDataClassScalar = 1;

std::array<uint32_t, 256> crc32c_table() {
  std::array<uint32_t, 256> t{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
    t[i] = c;
  }
  return t;
}

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

tensorboard::Event event_at(int64_t step) {
  tensorboard::Event e;
  e.set_wall_time(now_seconds());
  e.set_step(step);
  return e;
}

}  // namespace

uint32_t crc32c(const void* data, size_t n) {
  static const std::array<uint32_t, 256> table = crc32c_table();
  const auto* p = static_cast<const uint8_t*>(data);
  uint32_t c = 0xFFFFFFFFu;
  for (size_t i = 0; i < n; ++i) c = table[(c ^ p[i]) & 0xFF] ^ (c >> 8);
  return c ^ 0xFFFFFFFFu;
}

uint32_t masked_crc32c(const void* data, size_t n) {
  const uint32_t c = crc32c(data, n);
  return ((c >> 15) | (c << 17)) + 0xA282EAD8u;
}

Histogram make_histogram(std::span<const double> values, int buckets) {
  Histogram h;
  if (values.empty()) return h;
  h.min = *std::min_element(values.begin(), values.end());
  h.max = *std::max_element(values.begin(), values.end());
  h.num = static_cast<double>(values.size());
  for (double v : values) {
    h.sum += v;
    h.sum_squares += v * v;
  }
  const int n = h.max > h.min ? std::max(1, buckets) : 1;
  const double width = (h.max - h.min) / n;
  h.counts.assign(n, 0.0);
  for (int i = 0; i < n; ++i) h.limits.push_back(i + 1 == n ? h.max : h.min + width * (i + 1));
  for (double v : values) {
    const auto at = std::lower_bound(h.limits.begin(), h.limits.end(), v);
    h.counts[std::min<size_t>(at - h.limits.begin(), n - 1)] += 1;
  }
  return h;
}

Result<std::unique_ptr<TensorBoardLog>> TensorBoardLog::open(const std::string& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return Status::Error(dir + ": cannot create the TensorBoard folder: " + ec.message());
  char host[256] = "localhost";
  gethostname(host, sizeof host - 1);
  auto log = std::unique_ptr<TensorBoardLog>(new TensorBoardLog());
  // TensorBoard orders a folder's event files by name: seconds, then a pid keeps two apart.
  log->path_ = dir + "/events.out.tfevents." + std::to_string(static_cast<int64_t>(now_seconds())) +
               "." + host + "." + std::to_string(getpid()) + ".miles";
  log->f_ = std::fopen(log->path_.c_str(), "wb");
  if (!log->f_) return Status::Error("cannot create " + log->path_ + ": " + std::strerror(errno));
  tensorboard::Event version = event_at(0);
  version.set_file_version("brain.Event:2");
  MILES_RETURN_IF_ERROR(log->record(version.SerializeAsString()));
  MILES_RETURN_IF_ERROR(log->flush());
  return log;
}

TensorBoardLog::~TensorBoardLog() {
  if (f_) std::fclose(f_);
}

Status TensorBoardLog::record(const std::string& bytes) {
  const uint64_t len = bytes.size();  // little-endian on every target miles builds for
  const uint32_t len_crc = masked_crc32c(&len, sizeof len);
  const uint32_t data_crc = masked_crc32c(bytes.data(), bytes.size());
  if (std::fwrite(&len, sizeof len, 1, f_) != 1 || std::fwrite(&len_crc, 4, 1, f_) != 1 ||
      std::fwrite(bytes.data(), 1, bytes.size(), f_) != bytes.size() ||
      std::fwrite(&data_crc, 4, 1, f_) != 1)
    return Status::Error("writing " + path_ + ": " + std::strerror(errno));
  return Status::Ok();
}

Status TensorBoardLog::scalar(int64_t step, const std::string& tag, double value) {
  tensorboard::Event e = event_at(step);
  tensorboard::Summary::Value* v = e.mutable_summary()->add_value();
  v->set_tag(tag);
  v->set_simple_value(static_cast<float>(value));
  v->mutable_metadata()->set_data_class(kDataClassScalar);
  return record(e.SerializeAsString());
}

Status TensorBoardLog::histogram(int64_t step, const std::string& tag, const Histogram& h) {
  tensorboard::Event e = event_at(step);
  tensorboard::Summary::Value* v = e.mutable_summary()->add_value();
  v->set_tag(tag);
  tensorboard::HistogramProto* p = v->mutable_histo();
  p->set_min(h.min);
  p->set_max(h.max);
  p->set_num(h.num);
  p->set_sum(h.sum);
  p->set_sum_squares(h.sum_squares);
  for (double l : h.limits) p->add_bucket_limit(l);
  for (double c : h.counts) p->add_bucket(c);
  return record(e.SerializeAsString());
}

Status TensorBoardLog::text(int64_t step, const std::string& tag, const std::string& markdown) {
  tensorboard::Event e = event_at(step);
  tensorboard::Summary::Value* v = e.mutable_summary()->add_value();
  v->set_tag(tag);
  v->mutable_metadata()->mutable_plugin_data()->set_plugin_name("text");
  tensorboard::TensorProto* t = v->mutable_tensor();
  t->set_dtype(kDtString);
  t->mutable_tensor_shape();  // a scalar string
  t->add_string_val(markdown);
  return record(e.SerializeAsString());
}

Status TensorBoardLog::flush() {
  if (std::fflush(f_) != 0) return Status::Error("writing " + path_ + ": " + std::strerror(errno));
  return Status::Ok();
}

}  // namespace miles::controller
