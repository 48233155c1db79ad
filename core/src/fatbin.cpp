// Stub (being implemented): see kreg/fatbin.hpp.
#include "kreg/fatbin.hpp"

namespace kreg {

std::string CudaImage::name() const {
  return (kind == Kind::kPtx ? "compute_" : "sm_") + std::to_string(sm) +
         (arch_specific ? "a" : "");
}

bool CudaImages::runs_on(int32_t) const { return true; }

std::string CudaImages::summary() const { return has_fatbin ? "?" : "no .nv_fatbin section"; }

Result<CudaImages> read_cuda_images(const ElfFile&) { return CudaImages{}; }

Status check_arch_coverage(KernelSpec&, const CudaImages&, const std::string&) {
  return OkStatus();
}

std::string no_image_reason(int32_t sm, const CudaImages& images, const std::string& library) {
  return "no image for sm_" + std::to_string(sm) + " in " + library + ": built " +
         images.summary();
}

}  // namespace kreg
