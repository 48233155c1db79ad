// The fatbinary reader (kreg/fatbin.hpp) over arbitrary bytes taken as a .nv_fatbin
// section, and what is built on its answer: every image's name, runs_on for every SM, the
// summary, and the coverage check of a hand claim and a build claim. Whatever the headers
// claim, the reader must answer with images or an error, read nothing outside the buffer
// and allocate nothing in proportion to a claimed size (run with -malloc_limit_mb). Seeds:
// real nvcc 13 sections (tests/fixtures/fatbin), one per case, and cut copies.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "kreg/fatbin.hpp"

namespace {
volatile uint64_t g_sink = 0;
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view bytes(reinterpret_cast<const char*>(data), size);
  auto images = kreg::parse_fatbin_section(bytes, "fuzz input");
  if (!images.ok()) {
    g_sink = g_sink + images.status().message().size();
    return 0;
  }
  for (const kreg::CudaImage& i : images->images) g_sink = g_sink + i.name().size();
  for (int32_t sm = 0; sm < 200; ++sm) g_sink = g_sink + images->runs_on(sm);
  g_sink = g_sink + images->summary().size();
  for (uint32_t flags : {0u, static_cast<uint32_t>(KREG_KERNEL_CAPS_FROM_BUILD)}) {
    kreg::KernelSpec spec;
    spec.op = "fuzz.op";
    spec.backend = "cuda";
    spec.capabilities = {{kDLCUDA, 75, 89}, {kDLCUDA, 90, 121}};
    spec.flags = flags;
    kreg::Status st = kreg::check_arch_coverage(spec, *images, "libfuzz.so");
    g_sink = g_sink + st.ok() + spec.capabilities.size();
  }
  g_sink = g_sink + kreg::no_image_reason(75, *images, "libfuzz.so").size();
  return 0;
}
