#include "hot_swap.hpp"

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "harness.hpp"
#include "kreg/plugin_watcher.hpp"
#include "kreg/text.hpp"

namespace kreg::host {
namespace {

using harness::Buffer;

constexpr int64_t kTokens = 4, kHidden = 256, kD = 128;
constexpr double kEps = 1e-6;

std::mutex print_mu;

// A line of kreg's, with names, versions and messages from plugins in it: its own newlines
// kept, everything else made safe for the terminal (kreg/text.hpp).
void say(const std::string& line) {
  std::lock_guard lock(print_mu);
  std::printf("%s\n", terminal_message(line).c_str());
  std::fflush(stdout);
}

// One stress thread's tensors (f32, on the chosen device) and the expected results,
// computed once in double.
struct Work {
  Buffer x, weight, norm_out, gate_up, act_out;
  std::vector<double> norm_want, act_want;
};

Result<Work> make_work(DLDevice dev, uint64_t seed) {
  Work w;
  std::mt19937_64 rng(seed);
  auto mk = [&](std::vector<int64_t> shape, Buffer* out, bool fill) -> Status {
    auto b = Buffer::make(dev, DType::kF32, std::move(shape));
    if (!b.ok()) return b.status();
    *out = std::move(b).value();
    return fill ? out->fill_random(rng) : OkStatus();
  };
  for (Status st :
       {mk({kTokens, kHidden}, &w.x, true), mk({kHidden}, &w.weight, true),
        mk({kTokens, kHidden}, &w.norm_out, false), mk({kTokens, 2 * kD}, &w.gate_up, true),
        mk({kTokens, kD}, &w.act_out, false)}) {
    if (!st.ok()) return st;
  }
  auto x = w.x.to_doubles();
  auto wt = w.weight.to_doubles();
  auto gu = w.gate_up.to_doubles();
  if (!x.ok() || !wt.ok() || !gu.ok()) return Status(KREG_INTERNAL, "cannot read inputs back");
  w.norm_want.resize(static_cast<size_t>(kTokens * kHidden));
  for (int64_t t = 0; t < kTokens; ++t) {
    double ss = 0;
    for (int64_t h = 0; h < kHidden; ++h) ss += (*x)[t * kHidden + h] * (*x)[t * kHidden + h];
    const double inv = 1.0 / std::sqrt(ss / kHidden + kEps);
    for (int64_t h = 0; h < kHidden; ++h) {
      w.norm_want[t * kHidden + h] = (*x)[t * kHidden + h] * inv * (*wt)[h];
    }
  }
  w.act_want.resize(static_cast<size_t>(kTokens * kD));
  for (int64_t t = 0; t < kTokens; ++t) {
    for (int64_t i = 0; i < kD; ++i) {
      const double a = (*gu)[t * 2 * kD + i], b = (*gu)[t * 2 * kD + kD + i];
      w.act_want[t * kD + i] = a / (1 + std::exp(-a)) * b;
    }
  }
  return w;
}

// Empty when `got` matches `want` to f32 accuracy; else the first mismatch.
std::string mismatch(const char* op, const Buffer& got_buf, const std::vector<double>& want) {
  auto got = got_buf.to_doubles();
  if (!got.ok()) return std::string(op) + ": " + got.status().message();
  for (size_t i = 0; i < want.size(); ++i) {
    if (!(std::abs((*got)[i] - want[i]) <= 1e-5 + 1e-4 * std::abs(want[i]))) {
      return std::string(op) + ": element " + std::to_string(i) + " is " +
             std::to_string((*got)[i]) + ", expected " + std::to_string(want[i]);
    }
  }
  return "";
}

}  // namespace

int run_hot_swap(Registry& registry, const Manifest& manifest, const HotSwapOptions& options) {
  std::atomic<uint64_t> calls{0}, failed{0}, swaps{0}, rejected{0};
  std::unique_ptr<PluginWatcher> watcher;
  if (options.watch) {
    WatchOptions watch_options;
    watch_options.reload.precheck_in_child = options.precheck;
    watch_options.reload.precheck_timeout_s = options.precheck_timeout_s;
    auto w = PluginWatcher::start(
        registry, manifest,
        [&](const WatchEvent& ev) {
          char buf[64];
          if (ev.swapped) {
            ++swaps;
            std::snprintf(buf, sizeof buf, "%.2f", ev.latency_ms);
            say("swap group=" + ev.group + " generation=" + std::to_string(ev.report.generation) +
                " version=" + terminal_safe(ev.report.version) + " latency_ms=" + buf);
          } else {
            ++rejected;
            // The message may quote what the rejected build printed: one safe line per line.
            say("rejected group=" + ev.group + ": " + terminal_message(ev.error.message()));
          }
        },
        watch_options);
    if (!w.ok()) {
      say("kreg-host: " + w.status().message());
      return 1;
    }
    watcher = std::move(w).value();
    char timeout[32];
    std::snprintf(timeout, sizeof timeout, "%g", options.precheck_timeout_s);
    say(std::string("kreg-host: watching the plugin libraries for changes (") +
        (options.precheck ? "each new build is first loaded in a child process, timeout " +
                                std::string(timeout) + " s"
                          : "no child-process pre-check") +
        "; every generation runs from a private copy)");
  }

  std::atomic<bool> stop{false};
  std::vector<std::thread> threads;
  const Target target{options.device, DType::kF32};
  auto norm = registry.resolve("layernorm.rmsnorm", target);
  auto act = registry.resolve("activation.silu_and_mul", target);
  if (options.stress_threads > 0 && (!norm.ok() || !act.ok())) {
    say("kreg-host: --stress: " + (!norm.ok() ? norm.status() : act.status()).message());
    return 1;
  }
  for (int t = 0; t < options.stress_threads; ++t) {
    auto work = make_work(options.device, 1000 + static_cast<uint64_t>(t));
    if (!work.ok()) {
      say("kreg-host: --stress: " + work.status().message());
      return 1;
    }
    // Even threads call through handles resolved before any swap, odd ones by name.
    threads.emplace_back([&, t, w = std::move(work).value(), nh = *norm, ah = *act]() mutable {
      DLTensor* norm_args[] = {w.x.tensor(), w.weight.tensor(), w.norm_out.tensor()};
      DLTensor* act_args[] = {w.gate_up.tensor(), w.act_out.tensor()};
      uint64_t n = 0, bad = 0;
      int reported = 0;
      while (!stop.load(std::memory_order_relaxed)) {
        for (int op = 0; op < 2; ++op) {
          const Status st = t % 2 == 0
                                ? (op == 0 ? nh.call(norm_args) : ah.call(act_args))
                                : (op == 0 ? registry.call("layernorm.rmsnorm", norm_args)
                                           : registry.call("activation.silu_and_mul", act_args));
          std::string why = st.ok() ? "" : st.message();
          if (why.empty()) {
            if (Status sync = harness::device_synchronize(); !sync.ok()) why = sync.message();
          }
          if (why.empty()) {
            why = op == 0 ? mismatch("layernorm.rmsnorm", w.norm_out, w.norm_want)
                          : mismatch("activation.silu_and_mul", w.act_out, w.act_want);
          }
          ++n;
          if (!why.empty()) {
            ++bad;
            if (reported++ < 3) say("call failed (thread " + std::to_string(t) + "): " + why);
          }
        }
      }
      calls += n;
      failed += bad;
    });
  }
  if (options.stress_threads > 0) {
    say("kreg-host: " + std::to_string(options.stress_threads) +
        " stress threads calling layernorm.rmsnorm and activation.silu_and_mul on " +
        (options.device.device_type == kDLCUDA ? "cuda" : "cpu"));
  }
  const auto end =
      std::chrono::steady_clock::now() + std::chrono::duration<double>(options.duration_s);
  while (std::chrono::steady_clock::now() < end) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  stop = true;
  for (auto& t : threads) t.join();
  if (watcher) watcher->stop();
  say("calls=" + std::to_string(calls.load()) + " failed=" + std::to_string(failed.load()) +
      " swaps=" + std::to_string(swaps.load()) + " rejected=" + std::to_string(rejected.load()));
  return failed.load() == 0 ? 0 : 1;
}

}  // namespace kreg::host
