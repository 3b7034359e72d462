// confine_host (host_guard.h): compares resolved addresses, so a name and its address match.
#include "miles/host_guard.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>

#include <set>

#include "miles/host_port.h"
#include "miles/secret.h"

namespace miles {
namespace {

// The numeric addresses `host` resolves to (empty when it does not resolve).
std::set<std::string> addresses_of(const std::string& host) {
  std::set<std::string> out;
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  if (::getaddrinfo(host.c_str(), nullptr, &hints, &res) != 0) return out;
  for (addrinfo* a = res; a; a = a->ai_next) {
    char text[INET6_ADDRSTRLEN] = {};
    if (a->ai_family == AF_INET)
      inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(a->ai_addr)->sin_addr, text, sizeof text);
    else if (a->ai_family == AF_INET6)
      inet_ntop(AF_INET6, &reinterpret_cast<sockaddr_in6*>(a->ai_addr)->sin6_addr, text,
                sizeof text);
    if (text[0]) out.insert(text);
  }
  ::freeaddrinfo(res);
  return out;
}

// This machine: a loopback address (secret.h's test) or the unspecified one.
bool local(const std::string& address) {
  return is_loopback_host(address) || address == "0.0.0.0" || address == "::";
}

}  // namespace

Status confine_host(const std::string& address, const std::vector<std::string>& trusted,
                    const std::string& flag) {
  const size_t colon = address.rfind(':');
  const std::string host =
      unbracket(colon == std::string::npos ? address : address.substr(0, colon));
  const std::set<std::string> mine = addresses_of(host);
  if (mine.empty()) return Status::Error("the host of " + address + " does not resolve");
  bool all_local = true;
  for (const auto& a : mine) all_local = all_local && local(a);
  if (all_local) return Status::Ok();
  for (const auto& t : trusted)
    for (const auto& a : addresses_of(unbracket(t)))
      if (mine.count(a)) return Status::Ok();
  return Status::Error(address + " is not on this machine or a trusted host (" + flag +
                       "; an engine started with --controller trusts its controller's host)");
}

}  // namespace miles
