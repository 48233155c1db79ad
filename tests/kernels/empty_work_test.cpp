// Every implementation of every shipped op returns at once when its work is empty: some
// dimensions 0 and every other 2^40, so that each tensor holds no elements while a loop over
// the other dimensions (2^40 empty rows) would never end. Bad input found by the hostile-
// input audit of session 17: `kreg run layernorm.rmsnorm --shape T=1000000000000,H=0` spun
// in the CPU reference. The call may succeed (nothing to do) or refuse the arguments with
// an error naming the op; it may not loop. A call past its budget is named and ends the
// test binary (a thread in a loop cannot be stopped).
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "../unit/time_budget.hpp"
#include "harness.hpp"
#include "kernel_test.hpp"
#include "kreg/registry.hpp"

namespace kreg {
namespace {

constexpr int64_t kHuge = int64_t{1} << 40;

// Ends the process when a call runs past its budget, naming it (stderr).
class Watchdog {
 public:
  Watchdog() : thread_([this] { watch(); }) {}
  ~Watchdog() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }
  void arm(std::string what, double seconds) {
    std::lock_guard<std::mutex> lock(mu_);
    what_ = std::move(what);
    deadline_ = std::chrono::steady_clock::now() +
                std::chrono::milliseconds(static_cast<int64_t>(seconds * 1000));
    armed_ = true;
    cv_.notify_all();
  }
  void disarm() {
    std::lock_guard<std::mutex> lock(mu_);
    armed_ = false;
  }

 private:
  void watch() {
    std::unique_lock<std::mutex> lock(mu_);
    while (!stop_) {
      if (!armed_) {
        cv_.wait(lock);
      } else if (cv_.wait_until(lock, deadline_) == std::cv_status::timeout && armed_ &&
                 std::chrono::steady_clock::now() >= deadline_) {
        std::fprintf(stderr, "FAILED: %s did not return within its budget: it loops\n",
                     what_.c_str());
        std::fflush(stderr);
        std::_Exit(1);
      }
    }
  }
  std::mutex mu_;
  std::condition_variable cv_;
  std::string what_;
  std::chrono::steady_clock::time_point deadline_{};
  bool armed_ = false;
  bool stop_ = false;
  std::thread thread_;
};

// The lowest dtype of an implementation's set.
std::optional<DType> first_dtype(DTypeMask mask) {
  for (unsigned d = 0; d < 32; ++d) {
    if (mask & (DTypeMask{1} << d)) return static_cast<DType>(d);
  }
  return std::nullopt;
}

std::string shape_text(const harness::SymbolMap& s) {
  std::string out;
  for (const auto& [name, size] : s)
    out += (out.empty() ? "" : ",") + name + "=" + std::to_string(size);
  return out;
}

TEST(EmptyWork, EveryImplementationReturnsAtOnceWhenDimensionsAreZero) {
  Registry& reg = test::registry();
  Watchdog dog;
  const bool gpu = harness::gpu_available();
  int calls = 0;
  std::vector<std::string> rmsnorm_cases;
  for (const std::string& op : reg.op_ids()) {
    // Resolving loads a lazy group; implementations() then lists its specs.
    (void)reg.resolve(op, Target{test::kCpu, std::nullopt, {}});
    for (const KernelSpec* spec : reg.implementations(op)) {
      // jit implementations compile per shape (their range checks: jit_test); GPU ones need
      // a GPU.
      if (spec->backend == "jit") continue;
      const int32_t dev = spec->device_type();
      if (dev != kDLCPU && !(dev == kDLCUDA && gpu)) continue;
      const DLDevice device{static_cast<DLDeviceType>(dev), 0};
      const std::optional<DType> dtype = first_dtype(spec->dtypes);
      if (!dtype) continue;
      // Every nonempty proper subset of the dimensions at 0, the rest at 2^40.
      const std::vector<std::string>& dims = spec->signature.symbols;
      ASSERT_LE(dims.size(), 16u) << op;
      for (uint32_t zeros = 1; zeros + 1 < (uint32_t{1} << dims.size()); ++zeros) {
        harness::SymbolMap symbols;
        for (size_t i = 0; i < dims.size(); ++i) symbols[dims[i]] = (zeros >> i) & 1 ? 0 : kHuge;
        // Only the shapes whose every tensor is small enough to build: the others are
        // refused before any allocation (harness_test), which is not what this checks.
        if (!harness::check_example_fits(*spec, symbols, *dtype, device, true).ok()) continue;
        auto h = reg.resolve(op, Target{device, *dtype, symbols}, ResolveOptions{spec->backend});
        ASSERT_TRUE(h.ok()) << op << ": " << h.status().message();
        // Resources with their defaults (communication.comm: one rank); required attributes
        // without a default get 4 (num_experts, block_size: a call that refuses a value
        // still may not loop).
        std::vector<NamedAttr> named;
        std::vector<Resource> resources;
        bool skip = false;
        for (const Param& p : spec->signature.params) {
          if (p.kind == ArgKind::kResource) {
            std::vector<NamedAttr> params;
            if (dev == kDLCUDA) params.push_back({"device", int64_t{0}});
            auto r = reg.create_resource(p.resource_type, params);
            if (!r) {
              skip = true;  // e.g. no NCCL here: nothing to call
              break;
            }
            named.push_back({p.name, ResourceArg{r->get()}});
            resources.push_back(std::move(r).value());
          } else if (p.kind == ArgKind::kInt && !p.has_default) {
            named.push_back({p.name, int64_t{4}});
          } else if (p.kind == ArgKind::kFloat && !p.has_default) {
            named.push_back({p.name, 0.5});
          } else if (p.kind == ArgKind::kBool && !p.has_default) {
            named.push_back({p.name, false});
          }
        }
        if (skip) continue;
        auto attrs = h->attrs(named);
        if (!attrs.ok()) continue;  // a string attribute without a default: no value to guess
        const std::string what = op + " [" + spec->backend + "] " + shape_text(symbols);
        // kreg run's path: the example's values (routing ids for moe.align_block_size),
        // the call, the CPU reference and the comparison.
        dog.arm(what, test::budget(20));
        auto r = harness::check_against_reference(reg, *h, symbols, *dtype, *attrs, 7);
        dog.disarm();
        ++calls;
        if (!r.ok()) {
          EXPECT_NE(r.status().message().find(op), std::string::npos)
              << what << ": an error that does not name the op: " << r.status().message();
          continue;
        }
        for (const harness::Comparison& c : *r) EXPECT_TRUE(c.ok()) << what << ": " << c.tensor;
        if (op == "layernorm.rmsnorm" && spec->backend == "cpu") rmsnorm_cases.push_back(what);
      }
    }
  }
  // The case the audit found is among those run (H = 0 under 2^40 rows).
  EXPECT_NE(std::find(rmsnorm_cases.begin(), rmsnorm_cases.end(),
                      "layernorm.rmsnorm [cpu] H=0,T=" + std::to_string(kHuge)),
            rmsnorm_cases.end());
  EXPECT_GT(calls, 20);
}

}  // namespace
}  // namespace kreg
