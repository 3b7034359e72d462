// The http reward's URL (reward_internal.h): "host:port/path", "http://host:port/path" or
// "https://host/path", split into what httplib's client takes and the path it posts to.
//
// Why: RewardSpec::validate checks the URL when the job starts, and the http scorer splits the same
// way; neither needs the HTTP client to do it (the fuzzers link this file without httplib).
#include <algorithm>
#include <string>

#include "controller/reward_internal.h"

namespace miles::reward {
namespace {

bool all_digits(std::string_view s) {
  return !s.empty() && std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
}

}  // namespace

Result<HttpUrl> parse_http_url(std::string_view url) {
  const std::string quoted = "url '" + std::string(url) + "'";
  // A space or a control byte would end up in the request line or the Host header.
  for (const char c : url)
    if (static_cast<unsigned char>(c) <= 0x20 || c == 0x7f)
      return Status::Error(quoted + " holds a space or a control character");
  std::string scheme = "http";
  std::string_view rest = url;
  if (rest.starts_with("http://")) {
    rest.remove_prefix(7);
  } else if (rest.starts_with("https://")) {
    scheme = "https";
    rest.remove_prefix(8);
  } else if (rest.find("://") != std::string_view::npos) {
    return Status::Error(quoted + ": only http:// and https:// are supported");
  }
  size_t slash = rest.find('/');
  std::string_view host_port = rest.substr(0, slash);
  std::string path = slash == std::string_view::npos ? "/" : std::string(rest.substr(slash));
  size_t colon = host_port.rfind(':');
  std::string_view host = host_port.substr(0, colon);
  if (host.empty()) return Status::Error(quoted + " has no host");
  if (host.find_first_of(" \t?#@") != std::string_view::npos) {
    return Status::Error(quoted + " has a bad host '" + std::string(host) + "'");
  }
  if (colon != std::string_view::npos) {
    std::string_view port = host_port.substr(colon + 1);
    if (!all_digits(port) || port.size() > 5 || std::stoi(std::string(port)) == 0 ||
        std::stoi(std::string(port)) > 65535) {
      return Status::Error(quoted + " has a bad port '" + std::string(port) + "'");
    }
  }
  return HttpUrl{scheme + "://" + std::string(host_port), path};
}

}  // namespace miles::reward
