// MetricsLog (metrics_log.h).
#include "controller/metrics_log.h"

#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>

#include "miles/durable_file.h"
#include "miles/json_text.h"

namespace miles::controller {

Result<std::unique_ptr<MetricsLog>> MetricsLog::open(const std::string& path, Progress progress,
                                                     int64_t total, int64_t resume_step) {
  if (resume_step >= 0 && std::filesystem::exists(path)) {
    // Keep the history up to the resumed step; replace the file atomically.
    std::ifstream in(path);
    std::string kept, line;
    while (std::getline(in, line)) {
      auto j = parse_json_or_discarded(line);
      if (j.is_object() && j.value("step", int64_t{0}) <= resume_step) kept += line + "\n";
    }
    MILES_RETURN_IF_ERROR(write_file_synced(path + ".tmp", kept.data(), kept.size()));
    std::error_code ec;
    std::filesystem::rename(path + ".tmp", path, ec);
    if (ec) return Status::Error("cannot replace " + path + ": " + ec.message());
  } else if (resume_step < 0) {
    std::error_code ec;
    std::filesystem::remove(path, ec);
  }
  auto m = std::make_unique<MetricsLog>();
  m->f_ = std::fopen(path.c_str(), "a");
  if (!m->f_) return Status::Error("cannot open " + path + ": " + std::strerror(errno));
  const bool tty = isatty(STDERR_FILENO);
  m->bar_ = progress == Progress::kBar || (progress == Progress::kAuto && tty);
  m->lines_ = progress != Progress::kNone;
  m->total_ = total;
  return m;
}

MetricsLog::~MetricsLog() {
  if (f_) std::fclose(f_);
  if (bar_) std::fprintf(stderr, "\n");
}

Status MetricsLog::write(const nlohmann::json& j) {
  const std::string s = j.dump() + "\n";
  if (std::fwrite(s.data(), 1, s.size(), f_) != s.size() || std::fflush(f_) != 0)
    return Status::Error(std::string("writing metrics: ") + std::strerror(errno));
  return Status::Ok();
}

void MetricsLog::show(int64_t step, const std::string& line) {
  last_step_ = step;
  if (lines_) {
    if (bar_) std::fprintf(stderr, "\r\033[K");
    std::fprintf(stdout, "%s\n", line.c_str());
    std::fflush(stdout);
  }
  draw_bar();
}

void MetricsLog::draw_bar() {
  if (bar_) {
    const int width = 30;
    const int done = total_ > 0 ? static_cast<int>(width * last_step_ / total_) : 0;
    std::string bar(done, '#');
    bar += std::string(width - done, '.');
    std::fprintf(stderr, "\r[%s] %lld/%lld", bar.c_str(), static_cast<long long>(last_step_),
                 static_cast<long long>(total_));
    std::fflush(stderr);
  }
}

void MetricsLog::message(const std::string& line) {
  if (bar_) std::fprintf(stderr, "\r\033[K");
  std::fprintf(stderr, "%s\n", line.c_str());
  draw_bar();
}

}  // namespace miles::controller
