// The JIT backend's outside inputs over arbitrary bytes (kreg/jit_cache.hpp, kreg/jit.hpp).
// First byte even: the rest is a cache entry file on disk (the cache directory is shared,
// so anything may be there): lookup, list and get_or_build must report it invalid or
// return its image, never crash, read out of bounds or allocate in proportion to a size it
// claims. Odd: the rest is a kreg_jit_desc's text fields, NUL-separated (source, kernel,
// params, options, a header name and text), read against a fixed signature and, when
// accepted, specialized and turned into a kernel expression. Seeds: a real entry written
// by the cache (tests/fuzz/corpus/jit), cut copies, and descriptor field sets.
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>
#include <vector>

#include "kreg/abi.h"
#include "kreg/jit.hpp"
#include "kreg/jit_cache.hpp"
#include "kreg/kernel_spec.hpp"
#include "kreg/schema.hpp"

namespace {

namespace fs = std::filesystem;
volatile uint64_t g_sink = 0;

// The key the seed entry was written under (an entry names its own key; one written under
// another is invalid, a path worth reaching too).
constexpr const char* kKey = "0c48c17cfe13643fe1917280a2609a60b38f949b4934d3ebd45a2f95351845f5";

const fs::path& dir() {
  static const fs::path d = [] {
    std::string pattern = (fs::temp_directory_path() / "kreg-fuzz-jit-XXXXXX").string();
    if (::mkdtemp(pattern.data()) == nullptr) std::abort();
    return fs::path(pattern);
  }();
  return d;
}

void entry(std::string_view bytes) {
  static const std::string key = kKey;
  const fs::path file = dir() / "v1" / (key + ".kjit");
  std::error_code ec;
  fs::create_directories(file.parent_path(), ec);
  std::ofstream(file, std::ios::binary | std::ios::trunc).write(bytes.data(), bytes.size());
  kreg::jit::Cache cache(dir());
  if (auto image = cache.lookup(key)) g_sink = g_sink + image->size();
  if (auto list = cache.list()) {
    for (const auto& e : *list) g_sink = g_sink + e.size + e.problem.size() + e.meta.op.size();
  }
  auto got = cache.get_or_build(key, {"fuzz.op", "H=1", "sm_90a"}, [](std::string& image) {
    image = "rebuilt";
    return kreg::OkStatus();
  });
  if (got) g_sink = g_sink + got->image.size() + got->note.size();
}

void descriptor(std::string_view bytes) {
  std::vector<std::string> f;
  size_t start = 0;
  for (size_t i = 0; i <= bytes.size() && f.size() < 6; ++i) {
    if (i == bytes.size() || bytes[i] == '\0') {
      f.emplace_back(bytes.substr(start, i - start));
      start = i + 1;
    }
  }
  f.resize(6);
  static const kreg::Signature sig =
      kreg::parse_signature("k(Tensor[T,H] x, Tensor(a!)[T,2*H] out, float eps=1e-6) -> ()")
          .value();
  const kreg_jit_file header{f[4].c_str(), f[5].c_str()};
  const kreg_jit_desc d{sizeof(kreg_jit_desc), "fuzz.cu",    f[0].c_str(), &header, 1, 0,
                        f[1].c_str(),          f[2].c_str(), f[3].c_str()};
  auto src = kreg::read_jit_source(&d, sig);
  if (!src) {
    g_sink = g_sink + src.status().message().size();
    return;
  }
  kreg::KernelSpec spec;
  spec.op = "fuzz.k";
  spec.backend = "jit";
  spec.signature = sig;
  spec.dtypes = kreg::mask_of(kreg::DType::kBF16);
  spec.jit = *src;
  auto s = kreg::jit::specialize(spec, {{"T", 3}, {"H", 4097}}, kreg::DType::kBF16);
  if (s) g_sink = g_sink + kreg::jit::kernel_expression(**src, *s).size() + s->text().size();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const std::string_view rest(reinterpret_cast<const char*>(data) + 1, size - 1);
  if (data[0] % 2 == 0) {
    entry(rest);
  } else {
    descriptor(rest);
  }
  return 0;
}
