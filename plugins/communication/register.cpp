// PLACEHOLDER until the lead's registration lands (ops and the communication.comm resource
// type over comm.hpp). KREG_GROUP cannot take an empty op list (a zero-length array), so
// this is a hand-built descriptor with no kernels.
#include "kreg/abi.h"

namespace {
const kreg_build_info kBuild = {sizeof(kreg_build_info), "placeholder", 0, 0, ""};
const kreg_plugin_desc kDesc = {sizeof(kreg_plugin_desc),
                                KREG_ABI_MAJOR,
                                KREG_ABI_MINOR,
                                "communication",
                                KREG_PLUGIN_VERSION,
                                &kBuild,
                                nullptr,
                                0,
                                0,
                                nullptr,
                                nullptr};
}  // namespace

extern "C" __attribute__((visibility("default"))) const kreg_plugin_desc* kreg_plugin_entry() {
  return &kDesc;
}
