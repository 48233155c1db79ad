// The manifest parser on arbitrary bytes: it must return (never throw, hang or blow up:
// tools/fuzz.sh runs this with -timeout and -rss_limit_mb), its messages must stay bounded and
// free of raw control characters, and a pin rewrite of a valid manifest must parse back to
// exactly the pin written.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "kreg/manifest.hpp"

namespace {

const std::string kPin(64, 'a');

void check_message(const std::string& message) {
  // 51 diagnostics of bounded size (excerpts, key paths, locations).
  if (message.size() > 64 * 1024) std::abort();
  for (const char c : message) {
    const auto b = static_cast<unsigned char>(c);
    if ((b < 0x20 && b != '\n') || b == 0x7f) std::abort();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  kreg::ManifestOptions options;
  options.check_files = false;
  std::vector<kreg::ManifestDiagnostic> diagnostics;
  kreg::Result<kreg::Manifest> manifest =
      kreg::parse_manifest(text, "/fuzz/registry.yaml", options, &diagnostics);
  if (!manifest.ok()) {
    check_message(manifest.status().message());
    if (diagnostics.empty() || diagnostics.size() > 51) std::abort();
  }

  kreg::Result<std::string> pinned = kreg::rewrite_manifest_pins(text, {{"a", kPin}});
  if (!pinned.ok()) {
    check_message(pinned.status().message());
    return 0;
  }
  // The rewriter found group 'a'; on a manifest that was valid, the edit must keep it valid
  // and carry the pin (kreg validate --update-pins relies on it, and checks it again).
  if (manifest.ok()) {
    kreg::Result<kreg::Manifest> again =
        kreg::parse_manifest(*pinned, "/fuzz/registry.yaml", options);
    if (!again.ok()) std::abort();
    const kreg::GroupEntry* a = again->find_group("a");
    if (a == nullptr || a->sha256 != kPin) std::abort();
  }
  return 0;
}
