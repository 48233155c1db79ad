// A minimal streaming JSON writer for the CLI's --json output (stable, documented
// schemas in docs/cli.md). Handles commas and string escaping; nothing more.
#pragma once

#include <cmath>
#include <cstdio>
#include <ostream>
#include <string>
#include <string_view>
#include <vector>

#include "kreg/text.hpp"

namespace kreg::cli {

class JsonWriter {
 public:
  explicit JsonWriter(std::ostream& out) : out_(out) {}

  JsonWriter& begin_object() { return open('{'); }
  JsonWriter& end_object() { return close('}'); }
  JsonWriter& begin_array() { return open('['); }
  JsonWriter& end_array() { return close(']'); }

  JsonWriter& key(std::string_view k) {
    comma();
    string(k);
    out_ << ':';
    after_key_ = true;
    return *this;
  }
  JsonWriter& value(std::string_view s) {
    comma();
    string(s);
    return *this;
  }
  JsonWriter& value(const char* s) { return value(std::string_view(s)); }
  JsonWriter& value(const std::string& s) { return value(std::string_view(s)); }
  JsonWriter& value(bool b) {
    comma();
    out_ << (b ? "true" : "false");
    return *this;
  }
  JsonWriter& value(double d) {
    comma();
    // JSON has no NaN or infinity.
    if (!std::isfinite(d)) {
      out_ << "null";
      return *this;
    }
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.6g", d);
    out_ << buf;
    return *this;
  }
  JsonWriter& value(long long i) {
    comma();
    out_ << i;
    return *this;
  }
  JsonWriter& value(int i) { return value(static_cast<long long>(i)); }
  JsonWriter& value(unsigned long i) { return value(static_cast<long long>(i)); }
  JsonWriter& value(unsigned long long i) { return value(static_cast<long long>(i)); }
  JsonWriter& null() {
    comma();
    out_ << "null";
    return *this;
  }
  template <typename T>
  JsonWriter& field(std::string_view k, const T& v) {
    key(k);
    return value(v);
  }
  JsonWriter& strings(std::string_view k, const std::vector<std::string>& v) {
    key(k).begin_array();
    for (const auto& s : v) value(s);
    return end_array();
  }

 private:
  JsonWriter& open(char c) {
    comma();
    out_ << c;
    first_.push_back(true);
    return *this;
  }
  JsonWriter& close(char c) {
    out_ << c;
    first_.pop_back();
    if (first_.empty()) out_ << '\n';
    return *this;
  }
  void comma() {
    if (after_key_) {
      after_key_ = false;
      return;
    }
    if (!first_.empty()) {
      if (!first_.back()) out_ << ',';
      first_.back() = false;
    }
  }
  // kreg::json_escape: every control byte and invalid UTF-8 included, so the output
  // stays valid JSON whatever a plugin or manifest put in a string.
  void string(std::string_view s) { out_ << '"' << json_escape(s) << '"'; }

  std::ostream& out_;
  std::vector<bool> first_;
  bool after_key_ = false;
};

}  // namespace kreg::cli
