// Status and Result<T>: user errors as values.
//
// Why: malformed files, configs and requests are normal events for a server or a CLI. They travel back to
// the caller as a Status whose message names the file, tensor or field at fault; only broken invariants
// (bugs) abort, through MILES_CHECK in check.h.
#pragma once

#include <optional>
#include <string>
#include <utility>
#include <variant>

namespace miles {

class [[nodiscard]] Status {
 public:
  Status() = default;  // ok
  static Status Ok() { return Status(); }
  static Status Error(std::string message) {
    Status s;
    s.message_ = std::move(message);
    s.ok_ = false;
    return s;
  }
  bool ok() const { return ok_; }
  const std::string& message() const { return message_; }
  // Prefixes context ("reading foo.safetensors: ") to an error; an ok status stays ok.
  Status with_context(const std::string& context) const {
    if (ok_) return *this;
    return Error(context + ": " + message_);
  }

 private:
  bool ok_ = true;
  std::string message_;
};

template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : v_(std::move(value)) {}               // NOLINT(google-explicit-constructor)
  Result(Status status) : v_(std::move(status)) {}        // NOLINT(google-explicit-constructor)
  bool ok() const { return std::holds_alternative<T>(v_); }
  const T& value() const& { return std::get<T>(v_); }
  T& value() & { return std::get<T>(v_); }
  T&& value() && { return std::get<T>(std::move(v_)); }
  Status status() const { return ok() ? Status::Ok() : std::get<Status>(v_); }
  const std::string& message() const {
    static const std::string kEmpty;
    return ok() ? kEmpty : std::get<Status>(v_).message();
  }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }

 private:
  std::variant<T, Status> v_;
};

}  // namespace miles

#define MILES_CONCAT_INNER_(a, b) a##b
#define MILES_CONCAT_(a, b) MILES_CONCAT_INNER_(a, b)

// Returns the Status of `expr` from the enclosing function when it is an error.
#define MILES_RETURN_IF_ERROR(expr)               \
  do {                                            \
    ::miles::Status miles_status_ = (expr);       \
    if (!miles_status_.ok()) return miles_status_; \
  } while (0)

// `MILES_ASSIGN_OR_RETURN(auto x, MakeX())`: unwraps a Result or returns its error.
#define MILES_ASSIGN_OR_RETURN(lhs, expr) \
  MILES_ASSIGN_OR_RETURN_IMPL_(MILES_CONCAT_(miles_result_, __LINE__), lhs, expr)
#define MILES_ASSIGN_OR_RETURN_IMPL_(tmp, lhs, expr) \
  auto tmp = (expr);                                 \
  if (!tmp.ok()) return tmp.status();                \
  lhs = std::move(tmp).value()
