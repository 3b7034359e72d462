// confine_path: weakly_canonical on both sides, then a component-wise prefix test.
#include "miles/path_guard.h"

#include <algorithm>
#include <filesystem>

namespace miles {

namespace fs = std::filesystem;

namespace {

fs::path resolved(const std::string& p) {
  std::error_code ec;
  fs::path r = fs::weakly_canonical(fs::absolute(p, ec), ec);
  return ec ? fs::path() : r.lexically_normal();
}

bool inside(const fs::path& path, const fs::path& dir) {
  auto d = dir.begin(), p = path.begin();
  for (; d != dir.end(); ++d, ++p) {
    if (d->empty()) continue;  // a trailing separator
    if (p == path.end() || *p != *d) return false;
  }
  return true;
}

}  // namespace

Status confine_path(const std::string& path, const std::vector<std::string>& trusted,
                    const std::string& flag) {
  if (trusted.empty()) return Status::Ok();
  const fs::path p = resolved(path);
  if (!p.empty())
    for (const std::string& t : trusted) {
      const fs::path d = resolved(t);
      if (!d.empty() && inside(p, d)) return Status::Ok();
    }
  return Status::Error("the path " + path +
                       " is outside the directories this server trusts for "
                       "weights (" +
                       flag + ")");
}

}  // namespace miles
