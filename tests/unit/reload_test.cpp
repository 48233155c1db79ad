// Hot swapping: Registry::reload under load (the hammer test), rejections that leave the
// running generation serving, new ops, and the inotify watcher end to end. Also prints
// the swap latency (reload() and through the watcher).
#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <thread>
#include <vector>

#include "kreg/plugin_watcher.hpp"
#include "kreg/registry.hpp"
#include "test_support.hpp"

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

namespace kreg {
namespace {

using test::test_plugin;

double ms_since(Clock::time_point t) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t).count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

// A plugin directory of its own, holding libkreg_testgrp.so (v1 to start with).
class ReloadTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("kreg_reload_test_" + std::to_string(::getpid()) + "_" + std::to_string(counter_++));
    fs::create_directories(dir_);
    lib_ = dir_ / "libkreg_testgrp.so";
    fs::copy_file(test_plugin("testgrp"), lib_);
    manifest_.file = (dir_ / "test.yaml").string();
    GroupEntry e;
    e.name = "testgrp";
    e.library = lib_;
    e.library_spec = lib_.string();
    manifest_.groups.push_back(e);
    auto reg = Registry::open(manifest_);
    ASSERT_TRUE(reg.ok()) << reg.status().message();
    reg_ = std::move(reg).value();
  }
  void TearDown() override {
    reg_.reset();
    fs::remove_all(dir_);
  }

  // What a build does: write the new library under a temporary name, rename it in place.
  void place(const fs::path& from) {
    const fs::path tmp = dir_ / ".libkreg_testgrp.so.tmp";
    fs::copy_file(from, tmp, fs::copy_options::overwrite_existing);
    fs::rename(tmp, lib_);
  }

  uint64_t generation() const { return reg_->groups()[0].generation; }
  std::string version() const { return reg_->groups()[0].plugin->version; }

  // Calls testgrp.scale on [1..64] and returns the offset every element shows (0 or 1000),
  // or -1 on failure or a mix.
  int scale_offset() const {
    float in[64], out[64];
    for (int i = 0; i < 64; ++i) in[i] = static_cast<float>(i + 1);
    int64_t shape[1] = {64};
    DLTensor x{in, {kDLCPU, 0}, 1, {kDLFloat, 32, 1}, shape, nullptr, 0};
    DLTensor o{out, {kDLCPU, 0}, 1, {kDLFloat, 32, 1}, shape, nullptr, 0};
    DLTensor* args[] = {&x, &o};
    if (!reg_->call("testgrp.scale", args).ok()) return -1;
    const float off = out[0] - 2 * in[0];
    for (int i = 0; i < 64; ++i) {
      if (out[i] != 2 * in[i] + off) return -1;
    }
    return static_cast<int>(off);
  }

  static inline int counter_ = 0;
  fs::path dir_, lib_;
  Manifest manifest_;
  std::unique_ptr<Registry> reg_;
};

TEST_F(ReloadTest, SwapsAndReportsTheNewGeneration) {
  EXPECT_EQ(scale_offset(), 0);
  place(test_plugin("testgrp_v2"));
  auto r = reg_->reload("testgrp");
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(r->group, "testgrp");
  EXPECT_EQ(r->generation, 2u);
  EXPECT_EQ(r->version, "0.2.0");
  EXPECT_TRUE(r->added_ops.empty());
  EXPECT_EQ(scale_offset(), 1000);
  auto g = reg_->groups();
  ASSERT_EQ(g.size(), 1u);
  EXPECT_EQ(g[0].generation, 2u);
  EXPECT_EQ(g[0].plugin->version, "0.2.0");
  EXPECT_EQ(g[0].plugin->path, lib_);  // the file it came from, not the private copy

  EXPECT_EQ(reg_->reload("nosuch").status().code(), KREG_NOT_FOUND);
}

// /proc/self/maps lines naming a private copy of testgrp's generation `gen`.
int mapped_copies(uint64_t gen) {
  std::ifstream maps("/proc/self/maps");
  const std::string needle = "/testgrp." + std::to_string(gen) + ".";
  int n = 0;
  for (std::string line; std::getline(maps, line);) {
    n += line.find(needle) != std::string::npos && line.find("kreg-") != std::string::npos;
  }
  return n;
}

TEST_F(ReloadTest, SwappedInGenerationsStayMappedAfterTheRegistryIsGone) {
  place(test_plugin("testgrp_v2"));
  ASSERT_TRUE(reg_->reload("testgrp").ok());
  place(test_plugin("testgrp"));
  ASSERT_TRUE(reg_->reload("testgrp").ok());
  ASSERT_GT(mapped_copies(2), 0);
  reg_.reset();  // runs shutdown hooks; must not unmap code that GPU work may still use
  EXPECT_GT(mapped_copies(2), 0);
  EXPECT_GT(mapped_copies(3), 0);
}

TEST_F(ReloadTest, PublishesNewOps) {
  place(test_plugin("testgrp_plus"));
  auto r = reg_->reload("testgrp");
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(r->added_ops, std::vector<std::string>{"testgrp.negate"});
  float in[4] = {1, 2, 3, 4}, out[4] = {};
  int64_t shape[1] = {4};
  DLTensor x{in, {kDLCPU, 0}, 1, {kDLFloat, 32, 1}, shape, nullptr, 0};
  DLTensor o{out, {kDLCPU, 0}, 1, {kDLFloat, 32, 1}, shape, nullptr, 0};
  DLTensor* args[] = {&x, &o};
  ASSERT_TRUE(reg_->call("testgrp.negate", args).ok());
  EXPECT_EQ(out[3], -4.0f);
  EXPECT_EQ(reg_->groups()[0].ops.size(), 3u);
  // Going back to a build without it is refused: handles may use it.
  place(test_plugin("testgrp"));
  auto back = reg_->reload("testgrp");
  ASSERT_FALSE(back.ok());
  EXPECT_NE(back.status().message().find("testgrp.negate (cpu)"), std::string::npos)
      << back.status().message();
  EXPECT_EQ(generation(), 2u);
}

// 8 threads call testgrp.scale (through handles resolved before the swaps, and through
// Registry::call) while the main thread swaps v1 <-> v2 at least 200 times.
TEST_F(ReloadTest, HammerSwapsUnderLoad) {
  constexpr int kThreads = 8;
  constexpr int kSwaps = 200;
  std::atomic<bool> stop{false};
  std::atomic<uint64_t> calls{0}, failed{0}, torn{0}, seen_v1{0}, seen_v2{0};
  std::vector<std::thread> threads;
  {
    float in[64], out[64];
    int64_t shape[1] = {64};
    DLTensor x{in, {kDLCPU, 0}, 1, {kDLFloat, 32, 1}, shape, nullptr, 0};
    DLTensor o{out, {kDLCPU, 0}, 1, {kDLFloat, 32, 1}, shape, nullptr, 0};
    DLTensor* args[] = {&x, &o};
    auto h = reg_->resolve("testgrp.scale", args);
    ASSERT_TRUE(h.ok()) << h.status().message();
    for (int t = 0; t < kThreads; ++t) {
      threads.emplace_back([&, t, handle = *h] {
        float in[64], out[64];
        for (int i = 0; i < 64; ++i) in[i] = static_cast<float>(i + 1 + t);
        int64_t shape[1] = {64};
        DLTensor x{in, {kDLCPU, 0}, 1, {kDLFloat, 32, 1}, shape, nullptr, 0};
        DLTensor o{out, {kDLCPU, 0}, 1, {kDLFloat, 32, 1}, shape, nullptr, 0};
        DLTensor* args[] = {&x, &o};
        uint64_t n = 0, bad = 0, mixed = 0, v1 = 0, v2 = 0;
        while (!stop.load(std::memory_order_relaxed)) {
          std::fill(out, out + 64, -1.0f);
          const Status st = (t % 2 == 0) ? handle.call(args) : reg_->call("testgrp.scale", args);
          ++n;
          if (!st.ok()) {
            ++bad;
            continue;
          }
          int ones = 0, twos = 0;
          for (int i = 0; i < 64; ++i) {
            ones += out[i] == 2 * in[i];
            twos += out[i] == 2 * in[i] + 1000;
          }
          if (ones == 64) {
            ++v1;
          } else if (twos == 64) {
            ++v2;
          } else {
            ++mixed;
          }
        }
        calls += n;
        failed += bad;
        torn += mixed;
        seen_v1 += v1;
        seen_v2 += v2;
      });
    }
  }
  std::vector<double> latency;
  const auto t0 = Clock::now();
  for (int i = 0; i < kSwaps; ++i) {
    place(test_plugin(i % 2 == 0 ? "testgrp_v2" : "testgrp"));
    const auto complete = Clock::now();
    auto r = reg_->reload("testgrp");
    ASSERT_TRUE(r.ok()) << r.status().message();
    latency.push_back(ms_since(complete));
    EXPECT_EQ(r->version, i % 2 == 0 ? "0.2.0" : "0.1.0");
    // Let the callers run some calls on this generation.
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  const double total_ms = ms_since(t0);
  stop = true;
  for (auto& t : threads) t.join();
  std::printf(
      "[ hammer ] %d swaps in %.0f ms, %llu calls (v1 %llu, v2 %llu), failed %llu, "
      "torn %llu; reload() latency median %.3f ms, max %.3f ms\n",
      kSwaps, total_ms, static_cast<unsigned long long>(calls.load()),
      static_cast<unsigned long long>(seen_v1.load()),
      static_cast<unsigned long long>(seen_v2.load()),
      static_cast<unsigned long long>(failed.load()), static_cast<unsigned long long>(torn.load()),
      median(latency), *std::max_element(latency.begin(), latency.end()));
  EXPECT_EQ(failed.load(), 0u);
  EXPECT_EQ(torn.load(), 0u);
  EXPECT_GT(seen_v1.load(), 0u);
  EXPECT_GT(seen_v2.load(), 0u);
  EXPECT_EQ(generation(), 1u + kSwaps);
  EXPECT_EQ(scale_offset(), 0);  // an even number of swaps ends on v1
}

TEST_F(ReloadTest, RejectionsKeepTheRunningGeneration) {
  place(test_plugin("testgrp_v2"));
  ASSERT_TRUE(reg_->reload("testgrp").ok());
  ASSERT_EQ(scale_offset(), 1000);

  // A truncated file (a build still writing it).
  {
    const auto size = fs::file_size(test_plugin("testgrp"));
    fs::copy_file(test_plugin("testgrp"), dir_ / "trunc.so");
    fs::resize_file(dir_ / "trunc.so", size / 2);
  }
  struct Case {
    fs::path file;
    std::vector<std::string> expect;  // substrings of the message
  };
  const Case cases[] = {
      {dir_ / "trunc.so", {"truncated"}},
      {test_plugin("wrong_group"), {"declares group 'other'"}},
      {test_plugin("abi_major2"), {"ABI 2.", "majors must match"}},
      {test_plugin("init_fails"), {"lacks implementations", "testgrp.scale (cpu)"}},
      {test_plugin("empty_group"), {"lacks implementations", "testgrp.fail (cpu)"}},
      {test_plugin("testgrp_init_fails"), {"init hook failed", "simulated init failure"}},
      {test_plugin("testgrp_changed"),
       {"changes registrations", "testgrp.scale (cpu)",
        "'scale(Tensor[N] x, Tensor(a!)[N] out, float alpha=2.0) -> ()'",
        "'scale(Tensor[N] x, Tensor(a!)[N] out, float alpha=2.0, float beta=0.0) -> ()'"}},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.file.string());
    place(c.file);
    auto r = reg_->reload("testgrp");
    ASSERT_FALSE(r.ok());
    std::printf("[ rejected ] %s\n", r.status().message().c_str());
    EXPECT_NE(r.status().message().find("reload of group 'testgrp'"), std::string::npos);
    for (const std::string& s : c.expect) {
      EXPECT_NE(r.status().message().find(s), std::string::npos)
          << "missing '" << s << "' in: " << r.status().message();
    }
    EXPECT_EQ(generation(), 2u);
    EXPECT_EQ(version(), "0.2.0");
    EXPECT_EQ(scale_offset(), 1000);  // the old generation keeps serving
  }
  // And a good build is admitted after all that.
  place(test_plugin("testgrp"));
  auto r = reg_->reload("testgrp");
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(r->generation, 3u);
  EXPECT_EQ(scale_offset(), 0);
}

TEST_F(ReloadTest, ChildPrecheckRefusesCrashesWithoutLoading) {
  place(test_plugin("testgrp_init_fails"));
  ReloadOptions opts;
  opts.precheck_in_child = true;
  auto r = reg_->reload("testgrp", opts);
  ASSERT_FALSE(r.ok());
  std::printf("[ rejected ] %s\n", r.status().message().c_str());
  EXPECT_EQ(generation(), 1u);
  EXPECT_EQ(scale_offset(), 0);
  EXPECT_NE(r.status().message().find("child-process precheck failed"), std::string::npos);
  // Libraries that crash while loading or in their init hook: refused from the child,
  // this process never maps them.
  for (const char* name : {"crash_segv_static", "crash_segv_init", "crash_abort_init"}) {
    SCOPED_TRACE(name);
    place(test_plugin(name));
    auto crash = reg_->reload("testgrp", opts);
    ASSERT_FALSE(crash.ok());
    std::printf("[ rejected ] %s\n", crash.status().message().c_str());
    EXPECT_NE(crash.status().message().find("child-process precheck failed"), std::string::npos);
    EXPECT_EQ(generation(), 1u);
    EXPECT_EQ(scale_offset(), 0);
  }
  place(test_plugin("testgrp_v2"));
  auto ok = reg_->reload("testgrp", opts);
  ASSERT_TRUE(ok.ok()) << ok.status().message();
  EXPECT_EQ(scale_offset(), 1000);
}

// The watcher: a rename into place, a plain overwrite, a truncated file (rejected, then
// retried on the next event); the latency from the file being complete to the callback.
TEST_F(ReloadTest, WatcherSwapsOnRenameAndOverwrite) {
  std::mutex mu;
  std::condition_variable cv;
  std::vector<WatchEvent> events;
  std::vector<Clock::time_point> arrived;
  auto w = PluginWatcher::start(*reg_, manifest_, [&](const WatchEvent& ev) {
    std::lock_guard lock(mu);
    events.push_back(ev);
    arrived.push_back(Clock::now());
    cv.notify_all();
  });
  ASSERT_TRUE(w.ok()) << w.status().message();
  auto wait_for = [&](size_t n) {
    std::unique_lock lock(mu);
    return cv.wait_for(lock, std::chrono::seconds(10), [&] { return events.size() >= n; });
  };
  auto event = [&](size_t i) {
    std::lock_guard lock(mu);
    return std::make_pair(events[i], arrived[i]);
  };
  std::vector<double> latency;

  // 1. Written under a temporary name, renamed in place (IN_MOVED_TO).
  place(test_plugin("testgrp_v2"));
  auto complete = Clock::now();
  ASSERT_TRUE(wait_for(1));
  auto [e1, t1] = event(0);
  ASSERT_TRUE(e1.swapped) << e1.error.message();
  latency.push_back(std::chrono::duration<double, std::milli>(t1 - complete).count());
  EXPECT_EQ(e1.report.generation, 2u);
  EXPECT_EQ(e1.report.version, "0.2.0");
  EXPECT_EQ(scale_offset(), 1000);

  // 2. A plain overwrite of the file in place (IN_CLOSE_WRITE).
  auto overwrite = [&](const fs::path& from, uintmax_t size) {
    std::ifstream in(from, std::ios::binary);
    std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    bytes.resize(std::min<uintmax_t>(size, bytes.size()));
    std::ofstream out(lib_, std::ios::binary | std::ios::trunc);
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    out.close();
    return Clock::now();
  };
  complete = overwrite(test_plugin("testgrp"), UINTMAX_MAX);
  ASSERT_TRUE(wait_for(2));
  auto [e2, t2] = event(1);
  ASSERT_TRUE(e2.swapped) << e2.error.message();
  latency.push_back(std::chrono::duration<double, std::milli>(t2 - complete).count());
  EXPECT_EQ(e2.report.generation, 3u);
  EXPECT_EQ(scale_offset(), 0);

  // 3. A truncated write: reported, the running generation stays; the complete file's
  // event then swaps.
  const auto v2_size = fs::file_size(test_plugin("testgrp_v2"));
  overwrite(test_plugin("testgrp_v2"), v2_size / 3);
  ASSERT_TRUE(wait_for(3));
  auto [e3, t3] = event(2);
  EXPECT_FALSE(e3.swapped);
  EXPECT_NE(e3.error.message().find("truncated"), std::string::npos) << e3.error.message();
  EXPECT_EQ(scale_offset(), 0);
  EXPECT_EQ(generation(), 3u);
  overwrite(test_plugin("testgrp_v2"), UINTMAX_MAX);
  ASSERT_TRUE(wait_for(4));
  auto [e4, t4] = event(3);
  ASSERT_TRUE(e4.swapped) << e4.error.message();
  EXPECT_EQ(scale_offset(), 1000);

  // 4. More renames, for a latency median.
  for (int i = 0; i < 20; ++i) {
    place(test_plugin(i % 2 == 0 ? "testgrp" : "testgrp_v2"));
    complete = Clock::now();
    ASSERT_TRUE(wait_for(5 + static_cast<size_t>(i)));
    auto [e, t] = event(4 + static_cast<size_t>(i));
    ASSERT_TRUE(e.swapped) << e.error.message();
    latency.push_back(std::chrono::duration<double, std::milli>(t - complete).count());
    EXPECT_EQ(scale_offset(), i % 2 == 0 ? 0 : 1000);
  }
  (*w)->stop();
  std::printf("[ watcher ] %zu swaps: file complete -> callback median %.2f ms, max %.2f ms\n",
              latency.size(), median(latency), *std::max_element(latency.begin(), latency.end()));
  EXPECT_EQ(generation(), 24u);
}

// Swap latency of the shipped groups (layernorm, activation) when they were built.
TEST(ReloadBench, ShippedGroupsSwapLatency) {
  const fs::path built(KREG_PLUGIN_DIR);
  const fs::path dir =
      fs::temp_directory_path() / ("kreg_reload_bench_" + std::to_string(::getpid()));
  Manifest m;
  m.file = "bench.yaml";
  for (const char* name : {"layernorm", "activation"}) {
    const fs::path lib = built / ("libkreg_" + std::string(name) + ".so");
    if (!fs::exists(lib)) GTEST_SKIP() << lib << " not built";
    fs::create_directories(dir);
    fs::copy_file(lib, dir / lib.filename(), fs::copy_options::overwrite_existing);
    GroupEntry e;
    e.name = name;
    e.library = dir / lib.filename();
    e.library_spec = e.library.string();
    m.groups.push_back(e);
  }
  auto reg = Registry::open(m);
  ASSERT_TRUE(reg.ok()) << reg.status().message();
  for (const GroupEntry& e : m.groups) {
    std::vector<double> latency;
    for (int i = 0; i < 50; ++i) {
      const fs::path tmp = dir / ".tmp.so";
      fs::copy_file(built / e.library.filename(), tmp, fs::copy_options::overwrite_existing);
      fs::rename(tmp, e.library);
      const auto complete = Clock::now();
      auto r = (*reg)->reload(e.name);
      ASSERT_TRUE(r.ok()) << r.status().message();
      latency.push_back(ms_since(complete));
    }
    std::printf("[ latency ] %s (%ju bytes): reload() median %.2f ms over %zu swaps\n",
                e.name.c_str(), static_cast<uintmax_t>(fs::file_size(e.library)), median(latency),
                latency.size());
  }
  reg->reset();
  fs::remove_all(dir);
}

}  // namespace
}  // namespace kreg
