// kreg-host: the example host application. Loads the manifest's plugins, prints what it
// loaded, and runs one transformer MLP step through the registry:
//   fused_add_rmsnorm(x, residual, w)  ->  gate_up = x @ W (the host's own matmul:
//   cuBLAS on the GPU, a loop on the CPU)  ->  silu_and_mul(gate_up)
// on the GPU when there is one (else the CPU), then the same chain on the CPU references,
// and compares. Exit 0 when the results agree.
// --watch / --stress N / --duration S: hot-swap mode instead (hot_swap.cpp).
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>

#include <CLI/CLI.hpp>

#include "cli_numbers.hpp"
#include "cli_parse.hpp"
#include "cublas_matmul.hpp"
#include "harness.hpp"
#include "hot_swap.hpp"
#include "kreg/registry.hpp"
#include "terminal.hpp"

namespace {

using kreg::DType;
using kreg::Result;
using kreg::Status;
using kreg::harness::Buffer;

struct Shapes {
  int64_t tokens, hidden, intermediate;
};

// out[T,N] = a[T,K] @ b[K,N], fp32 accumulation, rounded to the buffers' dtype.
Status host_matmul(Buffer& a, Buffer& b, Buffer& out, const Shapes& s) {
  const int64_t T = s.tokens, K = s.hidden, N = 2 * s.intermediate;
  if (out.on_gpu()) return kreg::harness::cublas_matmul(a, b, out, T, N, K);
  auto av = a.to_doubles();
  auto bv = b.to_doubles();
  if (!av.ok()) return av.status();
  if (!bv.ok()) return bv.status();
  std::vector<double> c(static_cast<size_t>(T * N), 0.0);
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t k = 0; k < K; ++k) {
      const float x = static_cast<float>((*av)[static_cast<size_t>(t * K + k)]);
      for (int64_t n = 0; n < N; ++n) {
        c[static_cast<size_t>(t * N + n)] +=
            x * static_cast<float>((*bv)[static_cast<size_t>(k * N + n)]);
      }
    }
  }
  return out.from_doubles(c);
}

struct Step {
  Buffer x, residual, weight, w_up, gate_up, act;
};

Result<Step> make_step(const Shapes& s, DType dtype, DLDevice dev, uint64_t seed) {
  Step st;
  std::mt19937_64 rng(seed);
  auto mk = [&](std::vector<int64_t> shape, Buffer* out) {
    auto b = Buffer::make(dev, dtype, std::move(shape));
    if (!b.ok()) return b.status();
    *out = std::move(b).value();
    return out->fill_random(rng);
  };
  for (Status r :
       {mk({s.tokens, s.hidden}, &st.x), mk({s.tokens, s.hidden}, &st.residual),
        mk({s.hidden}, &st.weight), mk({s.hidden, 2 * s.intermediate}, &st.w_up),
        mk({s.tokens, 2 * s.intermediate}, &st.gate_up), mk({s.tokens, s.intermediate}, &st.act)}) {
    if (!r.ok()) return r;
  }
  // Keep the matmul's outputs O(1): scale the projection by 1/sqrt(hidden).
  auto w = st.w_up.to_doubles();
  if (!w.ok()) return w.status();
  for (double& v : *w) v /= std::sqrt(static_cast<double>(s.hidden));
  if (Status r = st.w_up.from_doubles(*w); !r.ok()) return r;
  return st;
}

Result<Step> copy_step(const Step& src, DLDevice dev) {
  Step st;
  const Buffer* from[] = {&src.x, &src.residual, &src.weight, &src.w_up, &src.gate_up, &src.act};
  Buffer* to[] = {&st.x, &st.residual, &st.weight, &st.w_up, &st.gate_up, &st.act};
  for (int i = 0; i < 6; ++i) {
    auto b = Buffer::make(dev, from[i]->dtype(), from[i]->shape());
    if (!b.ok()) return b.status();
    *to[i] = std::move(b).value();
    if (Status r = to[i]->copy_from(*from[i]); !r.ok()) return r;
  }
  return st;
}

// Runs the chain through resolved handles (the handles are resolved once by the caller).
Status run_chain(const kreg::KernelHandle& norm, const kreg::KernelHandle& act, Step& s,
                 const Shapes& shapes) {
  DLTensor* norm_args[] = {s.x.tensor(), s.residual.tensor(), s.weight.tensor()};
  if (Status st = norm.call(norm_args); !st.ok()) return st;
  if (Status st = host_matmul(s.x, s.w_up, s.gate_up, shapes); !st.ok()) return st;
  DLTensor* act_args[] = {s.gate_up.tensor(), s.act.tensor()};
  return act.call(act_args);
}

// Human output goes through terminal.hpp's printer: names, versions, build info and
// messages from plugins and manifests are escaped on their way to the terminal.
kreg::cli::Printer out(stdout);
kreg::cli::Printer err(stderr);

// A message kreg built (its own lines kept, each made safe) on stderr; exit 1.
int fail(const std::string& msg) {
  err << "kreg-host: " << kreg::cli::message(msg) << "\n";
  return 1;
}

// Why the step's shapes are too large for the host (its tensors, or the CPU reference's
// matmul, T x H x 2I multiply-adds), or null. The default step (16, 2048, 5632) is 3.7e8.
const char* step_too_large(const Shapes& s) {
  constexpr int64_t kMaxElements = int64_t{1} << 28;
  constexpr int64_t kMaxMultiplyAdds = int64_t{1} << 33;
  const int64_t T = s.tokens, H = s.hidden, N = 2 * s.intermediate;
  if (T * H > kMaxElements || H * N > kMaxElements || T * N > kMaxElements) {
    return "a tensor of the step would hold more than 2^28 elements";
  }
  if (T * H * N > kMaxMultiplyAdds) {
    return "the CPU reference's matmul would take more than 2^33 multiply-adds";
  }
  return nullptr;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"kreg-host: load the registry and run a transformer MLP step through it"};
  const char* env_manifest = std::getenv("KREG_MANIFEST");
  std::string manifest_path = env_manifest && *env_manifest ? env_manifest : "registry.yaml";
  std::string device = "auto", dtype_name = "bf16";
  Shapes shapes{16, 2048, 5632};
  app.add_option("--manifest", manifest_path, "registry manifest");
  app.add_option("--device", device, "auto, cuda or cpu")
      ->check(CLI::IsMember({"auto", "cuda", "cpu"}));
  app.add_option("--dtype", dtype_name, "bf16, f16 or f32");
  constexpr int64_t kMaxDim = int64_t{1} << 20;
  app.add_option("--tokens", shapes.tokens, "tokens in the batch")
      ->check(CLI::Range(int64_t{1}, kMaxDim));
  app.add_option("--hidden", shapes.hidden, "hidden size")->check(CLI::Range(int64_t{1}, kMaxDim));
  app.add_option("--intermediate", shapes.intermediate, "MLP intermediate size")
      ->check(CLI::Range(int64_t{1}, kMaxDim));
  bool watch = false;
  int stress = 0;
  double duration = 10;
  app.add_flag("--watch", watch, "hot swap: reload a group when its library file changes");
  app.add_option("--stress", stress, "N threads calling the loaded ops continuously, checked")
      ->check(CLI::Range(0, 256));
  app.add_option("--duration", duration, "seconds to run --watch / --stress (default 10)")
      ->check(kreg::cli::finite_range(0, 86400));
  bool no_precheck = false;
  double precheck_timeout = 10;
  app.add_flag("--no-precheck", no_precheck,
               "--watch: load each new build in-process directly, without first loading it in "
               "a child process (a build that crashes in its initializers then ends the host)");
  app.add_option("--precheck-timeout", precheck_timeout,
                 "--watch: seconds a child may take to load and initialize a new build before "
                 "it is rejected (default 10)")
      ->check(kreg::cli::finite_range(0.001, 3600));
  if (auto code = kreg::cli::parse_command_line(app, argc, argv, "kreg-host")) return *code;
  // Every step also runs on the CPU (the reference chain, the host's matmul a plain loop):
  // bounded so that a large shape is a usage error, not hours of work or a failed
  // allocation. Each dimension is at most 2^20, so the products below cannot overflow.
  if (const char* too_big = step_too_large(shapes)) {
    err << "kreg-host: " << kreg::cli::raw(too_big) << " (--tokens " << shapes.tokens
        << " --hidden " << shapes.hidden << " --intermediate " << shapes.intermediate
        << ")\nRun with --help for more information.\n";
    return 2;
  }
  // Checked with the other arguments, before anything loads: a usage error (2).
  auto dtype = kreg::parse_dtype(dtype_name);
  if (!dtype) {
    err << "kreg-host: unknown --dtype '" << kreg::excerpt(dtype_name)
        << "' (bf16, f16 or f32)\nRun with --help for more information.\n";
    return 2;
  }

  const auto t0 = std::chrono::steady_clock::now();
  auto manifest = kreg::load_manifest(manifest_path, kreg::manifest_options_from_env());
  // A manifest that cannot be read or does not parse is a usage error (2), as for kreg:
  // nothing can run from it.
  if (!manifest.ok()) {
    err << "kreg-host: manifest " << kreg::excerpt(manifest_path, 256) << ":"
        << kreg::cli::message("\n" + manifest.status().message()) << "\n";
    return 2;
  }
  // Watch mode: every generation, the first included, is mapped from a private copy (a
  // build rewriting a library in place must not truncate the code running here) and is
  // first loaded in a child process (kreg-probe, kreg/plugin_probe.hpp).
  kreg::OpenOptions open_options;
  if (watch) {
    open_options.private_copy = true;
    open_options.precheck_in_child = !no_precheck;
    open_options.precheck_timeout_s = precheck_timeout;
  }
  auto reg = kreg::Registry::open(*manifest, open_options);
  if (!reg.ok()) return fail(reg.status().message());
  const double load_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  kreg::Registry& registry = **reg;

  using kreg::cli::pad;
  out << "kreg-host: manifest " << manifest->file.string() << ", " << registry.groups().size()
      << " groups loaded in " << kreg::cli::num("%.1f", load_ms) << " ms\n";
  for (const auto& g : registry.groups()) {
    if (!g.loaded) {
      out << "  group " << pad(g.name, 11) << " "
          << (g.enabled ? "lazy (not loaded yet)" : "disabled") << "\n";
      continue;
    }
    out << "  group " << pad(g.name, 11) << " v" << g.plugin->version << "  generation "
        << g.generation << "  ABI " << g.plugin->abi_string() << "  CUDA "
        << g.plugin->cuda_string() << "\n";
    for (const auto& op : g.ops) {
      std::string backends;
      for (const auto* s : registry.implementations(op))
        backends += (backends.empty() ? "" : ", ") + s->backend;
      out << "    " << pad(op, 34) << " [" << backends << "]\n";
    }
  }
  // From here on printf prints only kreg's own words and values it checked (a parsed
  // dtype, op ids it asked for); both write to the same FILE*, so the order holds.

  const bool gpu = device == "cuda" || (device == "auto" && kreg::harness::gpu_available());
  if (device == "cuda" && !kreg::harness::gpu_available())
    return fail("--device cuda: no CUDA device");
  const DLDevice dev{gpu ? kDLCUDA : kDLCPU, 0};
  if (watch || stress > 0) {
    return kreg::host::run_hot_swap(registry, *manifest,
                                    {watch, stress, duration, dev, !no_precheck, precheck_timeout});
  }
  std::printf("kreg-host: MLP step T=%lld H=%lld I=%lld %s on %s\n",
              static_cast<long long>(shapes.tokens), static_cast<long long>(shapes.hidden),
              static_cast<long long>(shapes.intermediate), dtype_name.c_str(),
              gpu ? kreg::harness::gpu_name().c_str() : "cpu");

  // Inputs on the host, copied to the device: the reference chain starts from the same.
  auto host_step = make_step(shapes, *dtype, DLDevice{kDLCPU, 0}, 2024);
  if (!host_step.ok()) return fail(host_step.status().message());
  auto dev_step = copy_step(*host_step, dev);
  if (!dev_step.ok()) return fail(dev_step.status().message());

  const kreg::Target target{dev, *dtype};
  auto norm = registry.resolve("layernorm.fused_add_rmsnorm", target);
  auto act = registry.resolve("activation.silu_and_mul", target);
  if (!norm.ok()) return fail(norm.status().message());
  if (!act.ok()) return fail(act.status().message());
  const auto t1 = std::chrono::steady_clock::now();
  if (Status st = run_chain(*norm, *act, *dev_step, shapes); !st.ok()) return fail(st.message());
  if (Status st = kreg::harness::device_synchronize(); !st.ok()) return fail(st.message());
  const double step_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t1).count();
  std::printf("  %-30s -> [%s]\n  %-30s -> [host %s]\n  %-30s -> [%s]\n", norm->op().c_str(),
              norm->backend().c_str(), "matmul", gpu ? "cublas" : "loop", act->op().c_str(),
              act->backend().c_str());

  const kreg::Target cpu_target{DLDevice{kDLCPU, 0}, *dtype};
  auto norm_ref = registry.resolve("layernorm.fused_add_rmsnorm", cpu_target, {std::string("cpu")});
  auto act_ref = registry.resolve("activation.silu_and_mul", cpu_target, {std::string("cpu")});
  if (!norm_ref.ok()) return fail(norm_ref.status().message());
  if (!act_ref.ok()) return fail(act_ref.status().message());
  if (Status st = run_chain(*norm_ref, *act_ref, *host_step, shapes); !st.ok())
    return fail(st.message());

  const auto tol = kreg::harness::tolerance_for(*dtype);
  bool ok = true;
  const std::pair<const char*, std::pair<Buffer*, Buffer*>> outputs[] = {
      {"residual", {&dev_step->residual, &host_step->residual}},
      {"normed x", {&dev_step->x, &host_step->x}},
      {"mlp act", {&dev_step->act, &host_step->act}}};
  for (const auto& [name, bufs] : outputs) {
    auto got = bufs.first->to_doubles();
    auto want = bufs.second->to_doubles();
    if (!got.ok() || !want.ok()) return fail("cannot read results back");
    // The GPU matmul accumulates in another order: allow one more bf16 rounding step.
    auto c = kreg::harness::compare_values(name, *got, *want, {tol.atol * 2, tol.rtol * 2});
    ok = ok && c.ok();
    std::printf("  check %-9s max_abs_err %.3g  max_rel_err %.3g  mismatches %zu/%zu\n", name,
                c.max_abs, c.max_rel, c.mismatches, c.count);
  }
  std::printf(
      "kreg-host: %s: 2 registry ops + host matmul on %s in %.2f ms (first call); "
      "results %s the CPU references\n",
      ok ? "OK" : "FAILED", gpu ? "cuda" : "cpu", step_ms, ok ? "match" : "DO NOT match");
  return ok ? 0 : 1;
}
