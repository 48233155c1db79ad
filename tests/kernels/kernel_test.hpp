// What every kernel test shares: the registry of the shipped manifest (registry.yaml at
// the source root) with this build's plugin libraries, opened once per test binary.
#pragma once

#include <gtest/gtest.h>

#include <filesystem>
#include <memory>

#include "kreg/registry.hpp"

namespace kreg::test {

inline Registry& registry() {
  static std::unique_ptr<Registry> reg = [] {
    auto m = load_manifest(std::filesystem::path(KREG_SOURCE_DIR) / "registry.yaml",
                           ManifestOptions{std::filesystem::path(KREG_PLUGIN_DIR), true});
    EXPECT_TRUE(m.ok()) << m.status().message();
    auto r = Registry::open(*m);
    EXPECT_TRUE(r.ok()) << r.status().message();
    return std::move(r).value();
  }();
  return *reg;
}

}  // namespace kreg::test
