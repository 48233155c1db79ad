// The kreg Python extension (kreg._kreg): opening a manifest, introspection, hot swap, and
// op handles (op.hpp, the call path). Errors from the core become kreg.Error and its
// subclasses carrying the core's message. docs/python.md describes the API.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <filesystem>

#include "kreg/backend.hpp"
#include "kreg/manifest.hpp"
#include "kreg/registry.hpp"
#include "kreg/text.hpp"
#include "op.hpp"
#include "py_resource.hpp"

namespace py = pybind11;

namespace kreg::python {
namespace {

// Owns the Registry; op handles keep this Python object, and so the Registry, alive.
struct PyRegistry {
  Manifest manifest;
  std::unique_ptr<Registry> registry;
};

[[noreturn]] void throw_status(const Status& st) {
  raise_status(st);
  throw py::error_already_set();
}

std::string arg_kind_text(const Param& p) { return std::string(arg_kind_name(p.kind)); }

py::dict param_info(const Signature& sig, const Param& p) {
  py::dict d;
  d["name"] = p.name;
  d["kind"] = arg_kind_text(p);
  if (p.is_tensor()) {
    d["shape"] = sig.shape_name(p);
    d["dtypes"] = p.dtypes ? dtype_set_name(p.dtypes) : std::string("shared");
    d["read"] = p.read();
    d["written"] = p.written();
  } else {
    d["required"] = !p.has_default;
    if (p.has_default) d["default"] = p.default_text;
    if (p.kind == ArgKind::kResource) d["resource_type"] = p.resource_type;
  }
  return d;
}

py::dict impl_info(const KernelSpec& s) {
  py::dict d;
  d["backend"] = s.backend;
  d["priority"] = s.priority;
  d["dtypes"] = dtype_set_name(s.dtypes);
  py::list caps;
  for (const auto& c : s.capabilities) caps.append(c.to_string());
  d["capabilities"] = caps;
  d["traits"] = s.traits_string();
  d["mutates"] = s.mutates();
  d["graph_safe"] = s.graph_safe();
  d["deterministic"] = s.deterministic();
  d["description"] = s.description;
  d["library"] = s.provenance.library;
  d["source"] = s.provenance.source_file;
  const KernelBackend* b = find_backend(s.backend);
  d["available"] = b != nullptr && b->available();
  return d;
}

py::dict group_info(const GroupInfo& g) {
  py::dict d;
  d["name"] = g.name;
  d["loaded"] = g.loaded;
  d["enabled"] = g.enabled;
  d["load"] = g.load == LoadMode::kLazy ? "lazy" : "eager";
  d["generation"] = g.generation;
  d["version"] = g.plugin ? g.plugin->version : std::string();
  d["library"] = g.plugin ? g.plugin->path.string() : std::string();
  d["ops"] = g.ops;
  d["error"] = g.error;
  return d;
}

py::dict info(const PyRegistry& r, const std::string& op) {
  std::string id = op;
  py::dict d;
  if (auto chain = r.registry->resolve_alias(op)) {
    id = chain->op();
    d["alias_of"] = id;
    d["alias_chain"] = chain->names;
    d["deprecation"] = chain->message;
  }
  // A lazy group's embedded metadata answers without loading it; only a group without
  // metadata (built before SDK 1.2) is loaded, and only that one (the op id names it).
  auto impls = r.registry->implementations(id);
  if (impls.empty()) {
    (void)r.registry->resolve(op, Target{});
    if (auto chain = r.registry->resolve_alias(op)) id = chain->op();
    impls = r.registry->implementations(id);
  }
  if (impls.empty()) {
    auto h = r.registry->resolve(op, Target{});  // the core's reason: alias chain, failed group
    throw_status(h ? Status(KREG_NOT_FOUND, "unknown op '" + excerpt(op) + "'") : h.status());
  }
  const KernelSpec& front = *impls.front();
  d["op"] = id;
  d["group"] = std::string(front.group());
  for (const GroupInfo& g : r.registry->groups()) {
    if (g.name == front.group()) {
      d["generation"] = g.generation;
      d["plugin_version"] = g.plugin ? g.plugin->version : std::string();
      // "metadata": a lazy group described without being loaded
      d["source"] = group_source_name(g.source);
    }
  }
  d["signature"] = front.signature.text;
  d["dtypes"] = dtype_set_name(front.dtypes);
  py::list params;
  for (const Param& p : front.signature.params) params.append(param_info(front.signature, p));
  d["params"] = params;
  py::list list;
  for (const KernelSpec* s : impls) list.append(impl_info(*s));
  d["implementations"] = list;
  return d;
}

std::unique_ptr<PyRegistry> open_registry(const std::string& path,
                                          const std::optional<std::string>& plugin_dir,
                                          bool load_lazy, bool precheck) {
  // A path is a C string further down: a NUL would silently open a shorter one.
  if (path.find('\0') != std::string::npos) {
    throw_status(Status(KREG_INVALID_ARGUMENT,
                        "kreg.open(): the manifest path contains a NUL "
                        "character"));
  }
  if (plugin_dir && plugin_dir->find('\0') != std::string::npos) {
    throw_status(Status(KREG_INVALID_ARGUMENT, "kreg.open(): plugin_dir contains a NUL character"));
  }
  ManifestOptions mo = manifest_options_from_env();
  if (plugin_dir) mo.plugin_dir_override = *plugin_dir;
  auto result = std::make_unique<PyRegistry>();
  {
    py::gil_scoped_release release;
    auto manifest = load_manifest(path, mo);
    if (!manifest) {
      py::gil_scoped_acquire acquire;
      throw_status(manifest.status());
    }
    OpenOptions oo;
    oo.load_lazy_groups = load_lazy;
    oo.precheck_in_child = precheck;
    auto reg = Registry::open(*manifest, oo);
    if (!reg) {
      py::gil_scoped_acquire acquire;
      throw_status(reg.status());
    }
    result->manifest = std::move(manifest).value();
    result->registry = std::move(reg).value();
  }
  return result;
}

}  // namespace
}  // namespace kreg::python

PYBIND11_MODULE(_kreg, m) {
  using namespace kreg::python;
  m.doc() = "kreg: the kernel registry from Python (docs/python.md).";
  if (init_op_module(m.ptr()) < 0 || init_resource_type(m.ptr()) < 0) {
    throw py::error_already_set();
  }

  py::class_<PyRegistry>(m, "Registry", py::dynamic_attr(),
                         "The registry of one manifest. Op handles keep it alive.")
      .def_property_readonly(
          "manifest", [](const PyRegistry& r) { return r.manifest.file.string(); },
          "The manifest's path.")
      .def_property_readonly(
          "plugin_dir", [](const PyRegistry& r) { return r.manifest.plugin_dir.string(); },
          "Where the plugin libraries are loaded from.")
      .def(
          "list",
          [](const PyRegistry& r, const std::optional<std::string>& group) {
            if (!group) return r.registry->op_ids();
            for (const auto& g : r.registry->groups()) {
              if (g.name == *group) return g.ops;
            }
            throw_status(
                kreg::Status(KREG_NOT_FOUND, "no group named '" + kreg::excerpt(*group) + "'"));
          },
          py::arg("group") = py::none(), "Op ids, sorted (of one group when given).")
      .def(
          "groups",
          [](const PyRegistry& r) {
            py::list out;
            for (const auto& g : r.registry->groups()) out.append(group_info(g));
            return out;
          },
          "Every group: name, loaded, enabled, load, generation, version, library, ops, error.")
      .def("info", &info, py::arg("op"),
           "An op's signature, parameters, group generation and plugin version, and its "
           "implementations (backend, priority, dtypes, capabilities, traits, source).")
      .def(
          "op",
          [](py::object self, const std::string& id, const std::optional<std::string>& backend) {
            const PyRegistry& r = self.cast<const PyRegistry&>();
            PyObject* op = make_op(self.ptr(), r.registry.get(), id, backend);
            if (op == nullptr) throw py::error_already_set();
            return py::reinterpret_steal<py::object>(op);
          },
          py::arg("op"), py::arg("backend") = py::none(),
          "A callable handle for the op (an alias works too); backend forces one.")
      .def(
          "create_resource",
          [](py::object self, const std::string& type, py::kwargs params) {
            const PyRegistry& r = self.cast<const PyRegistry&>();
            PyObject* res = create_resource(self.ptr(), r.registry.get(), type, params.ptr());
            if (res == nullptr) throw py::error_already_set();
            return py::reinterpret_steal<py::object>(res);
          },
          py::arg("type"),
          "A new kreg.Resource of `type` (\"<group>.<name>\", e.g. \"communication.comm\"), "
          "its creation parameters as keywords (reg.resource_types() lists them). Ops take it "
          "for their Resource<...> parameters; kreg.torch's ops take its .id.")
      .def(
          "resource_types",
          [](const PyRegistry& r) {
            py::list out;
            for (const kreg::ResourceTypeInfo& t : r.registry->resource_types()) {
              py::dict d;
              d["type"] = t.type;
              d["signature"] = t.signature;
              d["description"] = t.description;
              d["generation"] = t.generation;
              d["live"] = t.live;
              out.append(d);
            }
            return out;
          },
          "The resource types of the loaded groups, sorted: type, signature (the creation "
          "parameters), description, generation, live (resources not yet destroyed).")
      .def(
          "reload",
          [](PyRegistry& r, const std::string& group, bool precheck) {
            kreg::ReloadOptions options;
            options.precheck_in_child = precheck;
            kreg::Result<kreg::ReloadReport> report = kreg::Status(KREG_INTERNAL, "unset");
            {
              py::gil_scoped_release release;
              report = r.registry->reload(group, options);
            }
            if (!report) throw_status(report.status());
            py::dict d;
            d["group"] = report->group;
            d["generation"] = report->generation;
            d["version"] = report->version;
            d["latency_ms"] = report->latency_ms;
            d["added_ops"] = report->added_ops;
            return d;
          },
          py::arg("group"), py::arg("precheck") = false,
          "Hot swap: loads the group's library again; existing handles run the new code.")
      .def(
          "_capsule",
          [](const PyRegistry& r) {
            // For kreg._torch (built against torch, so a separate extension): the core
            // Registry, valid while this object lives (kreg.torch keeps it alive).
            return py::capsule(static_cast<void*>(r.registry.get()), "kreg.Registry");
          },
          "The core Registry as a PyCapsule named kreg.Registry (for kreg.torch).")
      .def("__repr__", [](const PyRegistry& r) {
        return "<kreg.Registry " + r.manifest.file.string() + ", " +
               std::to_string(r.registry->op_ids().size()) + " ops>";
      });

  m.def(
      "set_pdl",
      [](bool on, bool stable) {
        if (stable && !on) throw py::value_error("kreg.set_pdl: stable_inputs needs enabled=True");
        set_launch_flags((on ? KREG_LAUNCH_PDL : 0) | (stable ? KREG_LAUNCH_STABLE_INPUTS : 0));
      },
      py::arg("enabled"), py::arg("stable_inputs") = false,
      "Programmatic dependent launch for every CUDA call from Python (sm90+, kernels that "
      "honour it): a kernel may start while the one before it on the stream finishes. "
      "stable_inputs=True also vouches that each op's stable inputs (docs/kernels.md: "
      "weights, tables, lengths, a cache's older rows) are never the previous kernel's "
      "output, so kernels may read them before waiting for it.");
  m.def(
      "pdl", [] { return (launch_flags() & KREG_LAUNCH_PDL) != 0; },
      "Whether CUDA calls ask for programmatic dependent launch (kreg.set_pdl).");
  m.def(
      "launch_flags", [] { return launch_flags(); },
      "The KREG_LAUNCH_* bits every CUDA call from Python carries (kreg.set_pdl sets them).");
  m.def(
      "_excerpt",
      [](py::handle s) -> std::string {
        // str, with lone surrogates kept as bytes so they are escaped rather than an error.
        py::object b = py::reinterpret_steal<py::object>(
            PyUnicode_AsEncodedString(s.ptr(), "utf-8", "surrogatepass"));
        if (!b) throw py::error_already_set();
        return kreg::excerpt(std::string(py::bytes(b)));
      },
      py::arg("s"),
      "kreg's excerpt of an outside value for a message: controls escaped, cut to about 80 "
      "characters (kreg/text.hpp).");
  m.def("open", &open_registry, py::arg("manifest") = "registry.yaml",
        py::arg("plugin_dir") = py::none(), py::arg("load_lazy") = false,
        py::arg("precheck") = false,
        "Opens a manifest (registry.yaml) and loads its eager groups (lazy ones too with "
        "load_lazy=True). plugin_dir overrides the manifest's (default: $KREG_PLUGIN_DIR, "
        "then the manifest's own).");
}
