// Secrets: API keys and run tokens, read from a file, the environment or a flag, compared in
// constant time, and made fresh per run.
//
// Why one home: every server (the engine's HTTP and gRPC, the controller's gRPC) checks a bearer
// token, and every client that `miles run` starts gets one; a key on the command line shows in
// `ps`, so files and environment variables come first.
#pragma once

#include <string>
#include <string_view>

#include "miles/status.h"

namespace miles {

// The secret from `file` (its contents, one trailing newline dropped) when given, else from the
// environment variable `env` when set and non-empty, else `flag` (possibly empty: no secret).
// Errors: an unreadable or empty file.
Result<std::string> read_secret(const std::string& flag, const std::string& file, const char* env);

// a == b without an early exit (the time does not tell how many leading bytes matched).
bool secret_equal(std::string_view a, std::string_view b);

// 32 random bytes from the OS, as 64 hex digits.
std::string fresh_token();

// The token of "Authorization: Bearer <token>" (empty when the header is not of that form).
std::string_view bearer_token(std::string_view authorization_header);

// A server's keys: `api` for every route, `admin` (when set) for the routes that change the engine
// (weights, pause, cache, groups, aborts); without an admin key those take the api key. Empty
// keys: no authentication.
struct ApiKeys {
  std::string api;
  std::string admin;
  bool any() const { return !api.empty() || !admin.empty(); }
  // Whether `token` (a bearer token, possibly empty) may call a route of that kind.
  bool allows(std::string_view token, bool admin_route) const;
};

// The run token of this process: MILES_RUN_TOKEN ("" when unset). `miles run` sets it (fresh, or
// the one it was given) and hands it to the engines and ranks it starts; its clients present it and
// its servers require it.
std::string run_token();

// Whether `host` names only this machine (127.0.0.0/8, ::1, localhost).
bool is_loopback_host(std::string_view host);

}  // namespace miles
