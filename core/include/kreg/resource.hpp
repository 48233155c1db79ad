// Resources (ABI 1.4; docs/design/resources.md): state that outlives a call, such as an
// NCCL communicator. A plugin declares a resource type (kreg_resource_type_desc) with
// typed creation parameters and create/destroy functions; Registry::create_resource
// returns an owning Resource; an op whose signature takes 'Resource<group.name> comm'
// receives it as an attribute (Resource::attr()), checked on every call (type, not
// destroyed) with a few loads and compares.
//
// A resource pins the generation of the library that created it: after a hot swap, calls
// that pass an older resource run that generation's implementation of the op (only its
// code knows the state's layout), new resources get the new code, and destroy runs the
// creating generation's destroy. Old generations are never unmapped (reload.cpp), so this
// costs nothing but a generation compare on calls that take resources.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>

#include "kreg/abi.h"
#include "kreg/schema.hpp"
#include "kreg/status.hpp"

namespace kreg {

inline constexpr uint32_t kMaxPluginResourceTypes = 64;

// One resource type as a plugin declared it, checked (make_resource_type_spec).
struct ResourceTypeSpec {
  std::string type;  // "<group>.<name>"
  Signature params;  // creation parameters: attributes only
  std::string description;
  decltype(kreg_resource_type_desc::create) create = nullptr;
  decltype(kreg_resource_type_desc::destroy) destroy = nullptr;

  std::string group() const { return type.substr(0, type.find('.')); }
  // Same type and parameters (what a reload must keep).
  bool same_registration(const ResourceTypeSpec& o) const {
    return type == o.type && params.text == o.params.text;
  }
};

// A descriptor's record -> spec: the type is "<group>.<name>" of `group`, the signature
// parses, takes attributes only (no tensors, no resources) and is named like the type,
// both functions are set. Errors name the record's field.
Result<ResourceTypeSpec> make_resource_type_spec(const kreg_resource_type_desc& d,
                                                 std::string_view group);

namespace detail {

// The core's record of one resource. Kernels see `pub` (the attribute points at it, so it
// is the first member). Slots are kept for the registry's life, also after destruction: an
// attribute that still points at a destroyed resource is refused, never read after free.
struct ResourceSlot {
  kreg_resource pub{};
  uint64_t type_hash = 0;  // hash_id(type): the call's type check is one compare
  std::atomic<bool> live{false};
  std::string type;  // storage behind pub.type
  decltype(kreg_resource_type_desc::destroy) destroy = nullptr;
  std::mutex mu;  // serializes destruction
  // Destroys the state once (no-op afterwards); true if this call destroyed it.
  bool destroy_once();
};

inline const ResourceSlot* slot_of(const kreg_resource* r) {
  return reinterpret_cast<const ResourceSlot*>(r);
}

}  // namespace detail

// An owning handle on one resource: it is destroyed (by the destroy of the generation that
// created it) on reset() or when the last handle goes; the registry destroys resources
// still live when it is destroyed itself. Movable, not copyable. Destroying a resource
// while a call that uses it runs (or GPU work it enqueued is pending) is the caller's
// error, as freeing a tensor would be.
class Resource {
 public:
  Resource() = default;
  ~Resource() { reset(); }
  Resource(Resource&&) noexcept = default;
  Resource& operator=(Resource&& o) noexcept {
    if (this != &o) {
      reset();
      slot_ = std::move(o.slot_);
    }
    return *this;
  }
  Resource(const Resource&) = delete;
  Resource& operator=(const Resource&) = delete;

  // Created and not yet destroyed.
  bool valid() const { return slot_ && slot_->live.load(std::memory_order_acquire); }
  uint64_t id() const { return slot_ ? slot_->pub.id : 0; }
  const std::string& type() const;
  uint64_t generation() const { return slot_ ? slot_->pub.generation : 0; }
  // The attribute that passes this resource to an op (also after reset(): the call is then
  // refused as "destroyed").
  kreg_attr attr() const {
    kreg_attr a{};
    a.type = KREG_ATTR_RESOURCE;
    a.value.r = slot_ ? &slot_->pub : nullptr;
    return a;
  }
  const kreg_resource* get() const { return slot_ ? &slot_->pub : nullptr; }
  // Destroys the resource now (no-op if it is already destroyed or empty).
  void reset();

 private:
  friend class Registry;
  explicit Resource(std::shared_ptr<detail::ResourceSlot> slot) : slot_(std::move(slot)) {}
  std::shared_ptr<detail::ResourceSlot> slot_;
};

// Introspection (kreg info): one resource type of a loaded group.
struct ResourceTypeInfo {
  std::string type;
  std::string signature;
  std::string description;
  uint64_t generation = 0;  // of the library that declares the type now
  size_t live = 0;          // resources of this type not yet destroyed (all generations)
};

}  // namespace kreg
