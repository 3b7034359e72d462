// MetricsTable (metrics_table.h).
#include "report/metrics_table.h"

#include <cmath>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <sstream>

#include "miles/json_text.h"

namespace miles::report {
namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

bool is_blank(std::string_view s) {
  for (char c : s)
    if (c != ' ' && c != '\t' && c != '\r') return false;
  return true;
}

}  // namespace

bool MetricsTable::has(const std::string& key) const {
  auto it = columns.find(key);
  if (it == columns.end()) return false;
  for (double v : it->second)
    if (std::isfinite(v)) return true;
  return false;
}

std::vector<double> MetricsTable::column(const std::string& key) const {
  auto it = columns.find(key);
  return it == columns.end() ? std::vector<double>(rows(), kNaN) : it->second;
}

std::vector<std::string> MetricsTable::reward_part_keys() const {
  std::vector<std::string> out;
  for (const auto& [k, v] : columns) {
    const bool part =
        k.size() > 12 && k.rfind("reward_", 0) == 0 && k.compare(k.size() - 5, 5, "_mean") == 0;
    if (part && has(k)) out.push_back(k);
  }
  return out;
}

Result<MetricsTable> parse_metrics_jsonl(std::string_view text, const std::string& name) {
  MetricsTable t;
  size_t line_no = 0;
  for (size_t i = 0; i < text.size();) {
    size_t nl = text.find('\n', i);
    if (nl == std::string_view::npos) nl = text.size();
    const std::string_view line = text.substr(i, nl - i);
    i = nl + 1;
    ++line_no;
    if (is_blank(line)) continue;
    const std::string where = name + ":" + std::to_string(line_no);
    auto parsed = parse_json_text(line);
    if (!parsed.ok()) {
      // nlohmann says "[json.exception.parse_error.101] parse error at line 1, column 9: ...";
      // the line is ours, the column and the reason are its.
      const std::string& what = parsed.message();
      const size_t col = what.find("column ");
      return Status::Error(where + ": malformed JSON (" +
                           (col == std::string::npos ? what : what.substr(col)) + ")");
    }
    const nlohmann::json& j = *parsed;
    if (!j.is_object())
      return Status::Error(where + ": expected a JSON object, got " + j.type_name());
    const size_t row = t.rows();
    double x = static_cast<double>(row + 1);
    if (auto s = j.find("step"); s != j.end() && s->is_number()) x = s->get<double>();
    t.step.push_back(x);
    for (auto& [k, col] : t.columns) col.push_back(kNaN);
    for (const auto& [k, v] : j.items()) {
      if (v.is_string()) {
        t.text.emplace(k, v.get<std::string>());
        continue;
      }
      if (!v.is_number() && !v.is_null() && !v.is_boolean()) continue;  // objects, arrays
      auto [it, inserted] = t.columns.try_emplace(k, std::vector<double>(row + 1, kNaN));
      if (inserted) t.keys.push_back(k);
      if (v.is_number()) it->second[row] = v.get<double>();
      if (v.is_boolean()) it->second[row] = v.get<bool>() ? 1.0 : 0.0;
    }
  }
  if (t.rows() == 0)
    return Status::Error(name + ": empty, no steps recorded (has the run done a step?)");
  return t;
}

Result<MetricsTable> read_metrics_jsonl(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return Status::Error(path + ": cannot open (no such file, or not readable)");
  std::ostringstream s;
  s << f.rdbuf();
  return parse_metrics_jsonl(s.str(), path);
}

}  // namespace miles::report
