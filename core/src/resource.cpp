// Resources (ABI 1.4, kreg/resource.hpp): checking a declared type, creating and
// destroying resources, and the generation lookup for calls that pass an older resource.
#include "kreg/resource.hpp"

#include <algorithm>
#include <cstring>

#include "kreg/registry.hpp"
#include "kreg/text.hpp"
#include "registry_group.hpp"

namespace kreg {

Result<ResourceTypeSpec> make_resource_type_spec(const kreg_resource_type_desc& d,
                                                 std::string_view group) {
  if (d.type == nullptr || d.type[0] == '\0') {
    return Status(KREG_INVALID_ARGUMENT, "the resource type has no name");
  }
  ResourceTypeSpec spec;
  spec.type = d.type;
  const std::string prefix = std::string(group) + ".";
  if (spec.type.rfind(prefix, 0) != 0 || spec.type.size() == prefix.size() ||
      spec.type.find('.', prefix.size()) != std::string::npos || !is_valid_op_id(spec.type)) {
    return Status(KREG_INVALID_ARGUMENT, "resource type '" + excerpt(spec.type) +
                                             "' must be named <group>.<name> with group '" +
                                             std::string(group) + "'");
  }
  if (d.signature == nullptr) {
    return Status(KREG_INVALID_ARGUMENT,
                  "resource type " + spec.type + " has no signature (its creation parameters)");
  }
  auto sig = parse_signature(d.signature);
  if (!sig) {
    return Status(KREG_INVALID_ARGUMENT, "resource type " + spec.type + ": signature '" +
                                             escape_control(d.signature) +
                                             "': " + sig.status().message());
  }
  const std::string name = spec.type.substr(prefix.size());
  if (sig->name != name) {
    return Status(KREG_INVALID_ARGUMENT, "resource type " + spec.type +
                                             ": its signature is named '" + excerpt(sig->name) +
                                             "', expected '" + name + "'");
  }
  for (const Param& p : sig->params) {
    if (p.kind == ArgKind::kTensor || p.kind == ArgKind::kResource) {
      return Status(KREG_INVALID_ARGUMENT, "resource type " + spec.type + ": parameter '" + p.name +
                                               "' is a " + std::string(arg_kind_name(p.kind)) +
                                               "; creation parameters are int, float, bool or str");
    }
  }
  if (d.create == nullptr || d.destroy == nullptr) {
    return Status(KREG_INVALID_ARGUMENT, "resource type " + spec.type + " lacks its " +
                                             (d.create == nullptr ? "create" : "destroy") +
                                             " function");
  }
  spec.params = std::move(sig).value();
  spec.description = d.description ? d.description : "";
  spec.create = d.create;
  spec.destroy = d.destroy;
  return spec;
}

namespace detail {

bool ResourceSlot::destroy_once() {
  std::lock_guard lock(mu);
  if (!live.load(std::memory_order_acquire)) return false;
  live.store(false, std::memory_order_release);
  destroy(pub.state);
  pub.state = nullptr;
  return true;
}

kreg_kernel_fn fn_of_generation(const Impl& impl, uint64_t gen) {
  std::lock_guard lock(impl.history_mu);
  // The current generation may have been stored after the caller read it.
  if (impl.generation.load(std::memory_order_acquire) == gen) {
    return impl.fn.load(std::memory_order_acquire);
  }
  for (const auto& [g, fn] : impl.history) {
    if (g == gen) return fn;
  }
  return nullptr;
}

Status no_generation_error(const Impl& impl, const kreg_resource& r) {
  uint64_t first = 0;
  {
    std::lock_guard lock(impl.history_mu);
    first = impl.history.empty() ? impl.generation.load(std::memory_order_acquire)
                                 : impl.history.front().first;
  }
  return Status(KREG_FAILED_PRECONDITION,
                impl.spec.op + " (" + impl.spec.backend + "): resource " + std::to_string(r.id) +
                    " (" + r.type + ") was created by generation " + std::to_string(r.generation) +
                    " of its group, which has no " + impl.spec.backend +
                    " implementation of this op (it came with generation " + std::to_string(first) +
                    "); create a new resource to use it");
}

}  // namespace detail

const std::string& Resource::type() const {
  static const std::string kNone;
  return slot_ ? slot_->type : kNone;
}

void Resource::reset() {
  if (slot_) {
    slot_->destroy_once();
    slot_.reset();
  }
}

namespace {

// The creation parameters by name -> positional attributes (defaults filled in); strings
// are kept in `strings`.
Result<std::vector<kreg_attr>> positional_params(const ResourceTypeSpec& spec,
                                                 const std::vector<NamedAttr>& named,
                                                 std::vector<std::string>* strings) {
  const Signature& sig = spec.params;
  const size_t n = static_cast<size_t>(sig.num_attrs);
  std::vector<kreg_attr> attrs(n);
  std::vector<int32_t> types(n);
  strings->reserve(n + named.size());  // no reallocation: attrs point into it
  for (size_t a = 0; a < n; ++a) {
    const Param& p = sig.attr(static_cast<int>(a));
    attrs[a] = p.default_value;
    if (p.kind == ArgKind::kString && p.has_default) {
      strings->push_back(p.default_text);
      attrs[a].value.s = strings->back().c_str();
    }
    types[a] = p.kind == ArgKind::kInt     ? KREG_ATTR_INT
               : p.kind == ArgKind::kFloat ? KREG_ATTR_FLOAT
               : p.kind == ArgKind::kBool  ? KREG_ATTR_BOOL
                                           : KREG_ATTR_STRING;
  }
  const detail::AttrSlots slots{spec.type,
                                "parameter",
                                sig,
                                types,
                                false,  // a resource is not a creation parameter
                                [strings](const std::string& v) {
                                  strings->push_back(v);
                                  return strings->back().c_str();
                                }};
  if (Status st = detail::fill_named_attrs(slots, named, attrs); !st.ok()) return st;
  return attrs;
}

}  // namespace

Result<Resource> Registry::create_resource(std::string_view type,
                                           const std::vector<NamedAttr>& params) {
  const size_t dot = type.find('.');
  if (dot == std::string_view::npos || dot == 0 || dot + 1 == type.size()) {
    return Status(KREG_INVALID_ARGUMENT,
                  "resource type '" + excerpt(type) + "' is not of the form <group>.<name>");
  }
  Group* g = find_group(type.substr(0, dot));
  if (g == nullptr) {
    return Status(KREG_NOT_FOUND, "resource type '" + excerpt(type) + "': no group '" +
                                      excerpt(type.substr(0, dot)) + "'");
  }
  if (Status st = ensure_loaded(*g); !st.ok()) {
    return Status(st.code(), "resource type '" + excerpt(type) + "': " + st.message());
  }
  ResourceTypeSpec spec;
  uint64_t generation = 0;
  {
    std::lock_guard lock(mu_);
    auto it = std::find_if(g->resource_types.begin(), g->resource_types.end(),
                           [&](const ResourceTypeSpec& r) { return r.type == type; });
    if (it == g->resource_types.end()) {
      std::string known;
      for (const ResourceTypeSpec& r : g->resource_types)
        known += (known.empty() ? "" : ", ") + r.type;
      return Status(KREG_NOT_FOUND,
                    "group '" + g->name + "' declares no resource type '" + excerpt(type) +
                        "' (it declares: " + (known.empty() ? "none" : known) + ")");
    }
    spec = *it;
    generation = g->generation;
  }
  std::vector<std::string> strings;
  auto attrs = positional_params(spec, params, &strings);
  if (!attrs) return attrs.status();
  // Without the registry lock: a create may wait for other processes (a bootstrap). The
  // library of `generation` is never unmapped, so its functions stay valid.
  const kreg_call_frame frame{sizeof(kreg_call_frame),
                              nullptr,
                              0,
                              static_cast<int32_t>(attrs->size()),
                              attrs->data(),
                              nullptr,
                              spec.type.c_str(),
                              nullptr,
                              0,
                              nullptr};
  char message[512];
  std::memset(message, 0, sizeof message);
  kreg_error err{sizeof(kreg_error), message, sizeof message};
  void* state = nullptr;
  int32_t rc = KREG_OK;
  try {
    rc = spec.create(&frame, &state, &err);
  } catch (...) {
    return Status(KREG_INTERNAL, spec.type + ": create threw a C++ exception across the C ABI");
  }
  if (rc != KREG_OK) {
    const std::string_view text(message, ::strnlen(message, sizeof message));
    const bool canonical = rc > KREG_OK && rc <= KREG_UNAUTHENTICATED;
    return Status(canonical ? static_cast<kreg_status_code>(rc) : KREG_UNKNOWN,
                  spec.type + ": create failed: " +
                      (text.empty() ? std::string("no message") : escape_control(text)));
  }
  if (state == nullptr) {
    return Status(KREG_INTERNAL, spec.type + ": create returned OK but no state");
  }
  auto slot = std::make_shared<detail::ResourceSlot>();
  slot->type = spec.type;
  slot->type_hash = detail::hash_id(spec.type);
  slot->destroy = spec.destroy;
  slot->pub = kreg_resource{sizeof(kreg_resource), slot->type.c_str(), state, 0, generation};
  {
    std::lock_guard lock(mu_);
    slot->pub.id = next_resource_id_++;
    slot->live.store(true, std::memory_order_release);
    resources_.push_back(slot);
  }
  return Resource(std::move(slot));
}

std::vector<ResourceTypeInfo> Registry::resource_types() const {
  std::lock_guard lock(mu_);
  std::vector<ResourceTypeInfo> out;
  for (const auto& [name, g] : groups_) {
    for (const ResourceTypeSpec& r : g->resource_types) {
      ResourceTypeInfo info{r.type, r.params.text, r.description, g->generation, 0};
      for (const auto& slot : resources_) {
        info.live += slot->type == r.type && slot->live.load(std::memory_order_acquire);
      }
      out.push_back(std::move(info));
    }
  }
  std::sort(out.begin(), out.end(),
            [](const ResourceTypeInfo& a, const ResourceTypeInfo& b) { return a.type < b.type; });
  return out;
}

const kreg_resource* Registry::find_resource(uint64_t id) const {
  std::lock_guard lock(mu_);
  // Ids are handed out in order and slots never leave resources_: position id - 1.
  if (id == 0 || id > resources_.size()) return nullptr;
  return &resources_[id - 1]->pub;
}

void Registry::destroy_resources() {
  // Newest first: a later resource may depend on an earlier one.
  for (auto it = resources_.rbegin(); it != resources_.rend(); ++it) (*it)->destroy_once();
}

}  // namespace kreg
