// Errors as values: a canonical code (abi.h's kreg_status_code) and a message that names
// the op, the argument and what was expected. An OK Status is a null pointer: it costs
// no allocation and almost nothing to return.
#pragma once

#include <cassert>
#include <memory>
#include <string>
#include <utility>
#include <variant>

#include "kreg/abi.h"

namespace kreg {

class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(kreg_status_code code, std::string message) {
    if (code != KREG_OK) rep_ = std::make_unique<Rep>(Rep{code, std::move(message)});
  }
  Status(const Status& o) : rep_(o.rep_ ? std::make_unique<Rep>(*o.rep_) : nullptr) {}
  Status& operator=(const Status& o) {
    if (this != &o) rep_ = o.rep_ ? std::make_unique<Rep>(*o.rep_) : nullptr;
    return *this;
  }
  Status(Status&&) noexcept = default;
  Status& operator=(Status&&) noexcept = default;

  bool ok() const { return rep_ == nullptr; }
  kreg_status_code code() const { return rep_ ? rep_->code : KREG_OK; }
  const std::string& message() const;
  // "INVALID_ARGUMENT: <message>"
  std::string to_string() const;

 private:
  struct Rep {
    kreg_status_code code;
    std::string message;
  };
  // Null when OK: the success path is one pointer, set and tested.
  std::unique_ptr<Rep> rep_;
};

inline Status OkStatus() { return Status(); }
const char* status_code_name(int32_t code);

// Either a value or a non-OK Status (a small std::expected until C++23).
template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : v_(std::move(value)) {}        // NOLINT(google-explicit-constructor)
  Result(Status status) : v_(std::move(status)) {  // NOLINT(google-explicit-constructor)
    assert(!std::get<Status>(v_).ok());
  }

  bool ok() const { return std::holds_alternative<T>(v_); }
  explicit operator bool() const { return ok(); }
  const Status& status() const {
    static const Status kOk;
    return ok() ? kOk : std::get<Status>(v_);
  }
  T& value() & { return std::get<T>(v_); }
  const T& value() const& { return std::get<T>(v_); }
  T&& value() && { return std::get<T>(std::move(v_)); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }

 private:
  std::variant<T, Status> v_;
};

}  // namespace kreg
