// Secrets: file > environment > flag; constant-time comparison; tokens from /dev/urandom.
#include "miles/secret.h"

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <random>
#include <sstream>

namespace miles {

Result<std::string> read_secret(const std::string& flag, const std::string& file, const char* env) {
  if (!file.empty()) {
    std::ifstream in(file, std::ios::binary);
    if (!in) return Status::Error("cannot read the key file " + file);
    std::ostringstream s;
    s << in.rdbuf();
    std::string key = s.str();
    while (!key.empty() && (key.back() == '\n' || key.back() == '\r')) key.pop_back();
    if (key.empty()) return Status::Error("the key file " + file + " is empty");
    return key;
  }
  if (env) {
    const char* v = std::getenv(env);
    if (v && *v) return std::string(v);
  }
  return flag;
}

bool secret_equal(std::string_view a, std::string_view b) {
  unsigned char diff = a.size() == b.size() ? 0 : 1;
  const size_t n = std::max(a.size(), b.size());
  for (size_t i = 0; i < n; ++i) {
    const unsigned char x = i < a.size() ? static_cast<unsigned char>(a[i]) : 0;
    const unsigned char y = i < b.size() ? static_cast<unsigned char>(b[i]) : 0;
    diff |= static_cast<unsigned char>(x ^ y);
  }
  return diff == 0;
}

std::string fresh_token() {
  std::random_device rd;  // /dev/urandom on Linux
  static const char* hex = "0123456789abcdef";
  std::string out;
  for (int i = 0; i < 8; ++i) {
    const uint32_t w = rd();
    for (int b = 0; b < 8; ++b) out.push_back(hex[(w >> (4 * b)) & 0xF]);
  }
  return out;
}

std::string_view bearer_token(std::string_view h) {
  constexpr std::string_view kBearer = "Bearer ";
  if (h.size() <= kBearer.size() || h.substr(0, kBearer.size()) != kBearer) return {};
  return h.substr(kBearer.size());
}

bool ApiKeys::allows(std::string_view token, bool admin_route) const {
  const bool is_admin = !admin.empty() && secret_equal(token, admin);
  if (admin_route) return admin.empty() ? (api.empty() || secret_equal(token, api)) : is_admin;
  return api.empty() ? (admin.empty() || is_admin) : (is_admin || secret_equal(token, api));
}

std::string run_token() {
  const char* v = std::getenv("MILES_RUN_TOKEN");
  return v ? std::string(v) : std::string();
}

bool is_loopback_host(std::string_view host) {
  return host == "localhost" || host == "::1" || host == "[::1]" || host.substr(0, 4) == "127.";
}

}  // namespace miles
