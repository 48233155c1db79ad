// Resolution of a jit implementation: the call's specialization is compiled (or found in
// the cache) and loaded once, into an implementation record of its own whose argument
// check pins the specialized values (H = 4096, dtype bf16), so a handle to it calls the
// loaded kernel with an AOT kernel's per-call cost and refuses arguments it was not
// compiled for (kreg.Op and the torch ops then resolve again).
#include <cstdio>

#include "kreg/jit.hpp"
#include "kreg/jit_cache.hpp"
#include "registry_group.hpp"

namespace kreg {

using detail::Impl;

namespace {

// The spec with its specialized values pinned: each specialized dimension becomes a
// literal extent, the shared dtype a single one.
Result<KernelSpec> pinned_spec(const KernelSpec& generic, const jit::Specialization& s) {
  KernelSpec spec = generic;
  spec.jit = nullptr;  // a specialization is not specialized again
  for (const auto& [name, value] : s.values) {
    if (name == "dtype") {
      auto d = parse_dtype(value);
      if (!d) return Status(KREG_INTERNAL, "unknown dtype " + value);
      spec.dtypes = mask_of(*d);
      continue;
    }
    int32_t symbol = -1;
    for (size_t i = 0; i < spec.signature.symbols.size(); ++i) {
      if (spec.signature.symbols[i] == name) symbol = static_cast<int32_t>(i);
    }
    const int64_t v = std::stoll(value);
    for (Param& p : spec.signature.params) {
      for (DimExpr& e : p.dims) {
        if (e.symbol != symbol) continue;
        int64_t extent = 0;
        if (__builtin_mul_overflow(v, int64_t{e.coef}, &extent)) {
          return Status(KREG_INVALID_ARGUMENT, generic.op + ": " + std::to_string(e.coef) + "*" +
                                                   name + " overflows for " + name + " = " + value);
        }
        e = DimExpr{extent, 1, -1};
      }
    }
  }
  spec.description = generic.description + " [jit " + s.text() + "]";
  return spec;
}

}  // namespace

const Impl* Registry::specialize_jit(const Impl& generic, std::span<DLTensor* const> args,
                                     const Target* target, std::string* why) const {
  const JitSource* src = generic.jit.load(std::memory_order_acquire);
  auto fail = [&](const std::string& reason) -> const Impl* {
    if (why != nullptr) *why = reason;
    return nullptr;
  };
  if (src == nullptr) return fail("no JIT source");
  // The last specialization, when it is still current (same source and launcher: no hot
  // swap since) and these tensors pass its check: no lock, no strings.
  if (target == nullptr && !args.empty() && args[0] != nullptr) {
    const Impl* last = generic.jit_last.load(std::memory_order_acquire);
    if (last != nullptr && last->jit_origin == src &&
        last->jit_device == args[0]->device.device_id &&
        last->fn.load(std::memory_order_relaxed) == generic.fn.load(std::memory_order_acquire) &&
        last->plan.accepts_tensors(args)) {
      return last;
    }
  }
  // The values come from the tensors, or from the target's dimensions and dtype.
  Result<jit::Specialization> s = Status(KREG_INVALID_ARGUMENT, "no tensors to specialize on");
  DLDevice device{kDLCUDA, 0};
  if (target != nullptr) {
    s = jit::specialize(generic.spec, target->dims, target->dtype);
    device = target->device;
  } else if (!args.empty() && args[0] != nullptr) {
    s = jit::specialize(generic.spec, args);
    device = args[0]->device;
  }
  if (!s) return fail(s.status().message());
  const auto sm = generic.backend->sm_of(device.device_id);
  if (!sm) return fail("cannot read the compute capability of the arguments' device");
  const std::string arch = jit::arch_name(*sm);
  const kreg_kernel_fn fn = generic.fn.load(std::memory_order_acquire);
  char ids[64];
  std::snprintf(ids, sizeof ids, "%p/%p/%p/", static_cast<const void*>(&generic),
                static_cast<const void*>(src), reinterpret_cast<const void*>(fn));
  const std::string id = ids + arch + "/" + s->text();

  std::lock_guard lock(jit_->mu);
  if (auto it = jit_->entries.find(id); it != jit_->entries.end()) {
    if (!it->second.impl) return fail(it->second.error);
    generic.jit_last.store(it->second.impl.get(), std::memory_order_release);
    return it->second.impl.get();
  }
  detail::JitState::Entry& entry = jit_->entries[id];
  auto made = [&]() -> Result<std::unique_ptr<Impl>> {
    auto cache = jit::process_cache();
    if (!cache) return cache.status();
    auto compiled = jit::build(generic.spec, *src, *s, arch, **cache);
    if (!compiled) return compiled.status();
    if (!compiled->note.empty()) std::fprintf(stderr, "kreg: jit: %s\n", compiled->note.c_str());
    auto kernel = jit::load(*compiled);
    if (!kernel) return kernel.status();
    auto spec = pinned_spec(generic.spec, *s);
    if (!spec) return spec.status();
    auto impl = detail::make_impl(*spec);
    impl->fn.store(fn, std::memory_order_relaxed);
    impl->generation.store(generic.generation.load(std::memory_order_acquire),
                           std::memory_order_relaxed);
    impl->op = generic.op;
    impl->jit_kernel = *kernel;
    impl->jit_origin = src;
    impl->jit_device = device.device_id;
    return impl;
  }();
  if (!made) {
    entry.error = made.status().message();
    // Said once: selection goes on to the next implementation (an AOT kernel) silently.
    std::fprintf(stderr, "kreg: jit: %s\n", entry.error.c_str());
    return fail(entry.error);
  }
  entry.impl = std::move(made).value();
  generic.jit_last.store(entry.impl.get(), std::memory_order_release);
  return entry.impl.get();
}

}  // namespace kreg
