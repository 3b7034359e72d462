// "host:port" strings for listeners, gRPC targets and the addresses engines and controllers
// exchange: an IPv6 host goes in brackets ("[::1]:30000"), the form gRPC and parse_host_port
// expect.
#pragma once

#include <cstdint>
#include <string>

namespace miles {

inline std::string host_port(const std::string& host, int64_t port) {
  if (host.find(':') != std::string::npos && host.front() != '[')
    return "[" + host + "]:" + std::to_string(port);
  return host + ":" + std::to_string(port);
}

// "[::1]" → "::1" (sockets and HTTP clients take the bare address); other hosts unchanged.
inline std::string unbracket(const std::string& host) {
  if (host.size() > 1 && host.front() == '[' && host.back() == ']')
    return host.substr(1, host.size() - 2);
  return host;
}

}  // namespace miles
