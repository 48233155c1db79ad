// kreg: the registry's command line. list, info, validate, run, bench, jit.
// Exit codes: see "exit codes" below and docs/cli.md. Human output goes through
// terminal.hpp's Printer, which escapes every string that is not one of kreg's literals.
#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <iostream>
#include <sstream>

#include <unistd.h>
#include <CLI/CLI.hpp>

#include "cli_numbers.hpp"
#include "harness.hpp"
#include "json.hpp"
#include "kreg/jit.hpp"
#include "kreg/jit_cache.hpp"
#include "kreg/parse_number.hpp"
#include "kreg/registry.hpp"
#include "kreg/text.hpp"
#include "kreg/validation.hpp"
#include "terminal.hpp"

namespace fs = std::filesystem;
using kreg::cli::JsonWriter;
using kreg::cli::message;
using kreg::cli::num;
using kreg::cli::pad;
using kreg::cli::raw;

namespace {

// ---- exit codes: one rule for every subcommand (docs/cli.md "Exit codes") ----
// 0  done, and what was checked or run is fine.
// 1  what was checked or run failed: validate's violations, a mismatch against the CPU
//    reference, an error from a kernel, a group that does not load, no GPU for bench.
// 2  kreg could not start what was asked: a bad or unknown option or value, an unknown op
//    or group, a missing or unknown dimension, a bad attribute, a manifest or other file
//    named on the command line that cannot be read. Outside validate, a manifest with
//    errors is 2 as well (nothing can run from it); validate's job is to report those
//    errors, so there they are violations (1), and only a manifest it cannot read is 2.
constexpr int kExitOk = 0;
constexpr int kExitFailed = 1;
constexpr int kExitUsage = 2;

kreg::cli::Printer out(stdout);
kreg::cli::Printer err(stderr);

// Prints one diagnostic line on stderr (literals as written, strings escaped, a Status
// message through message()) and returns `code`: every error of every subcommand.
template <typename... Parts>
int fail(int code, const Parts&... parts) {
  (err << ... << parts) << "\n";
  return code;
}

// The exit code of a failed lookup for what the user asked (resolve, attributes): an op,
// backend or dtype that does not exist or does not fit is a usage error; anything else
// (a group that failed to load, an internal error) is a failure.
int exit_code_for(const kreg::Status& st) {
  switch (st.code()) {
    case KREG_NOT_FOUND:
    case KREG_INVALID_ARGUMENT:
    case KREG_OUT_OF_RANGE:
      return kExitUsage;
    default:
      return kExitFailed;
  }
}

std::string default_manifest() {
  const char* env = std::getenv("KREG_MANIFEST");
  return env && *env ? env : "registry.yaml";
}

struct Opened {
  kreg::Manifest manifest;
  std::unique_ptr<kreg::Registry> registry;
  // Resources run and bench create for an op's Resource<...> parameters (destroyed before
  // the registry: declared after it).
  std::vector<kreg::Resource> resources;
  ~Opened() { resources.clear(); }
};

// Loads the manifest and every enabled eager group; lazy groups too with `load_lazy` (run,
// bench: loading is the point), else they are described by their embedded metadata and
// load only when one of their ops is resolved. Prints and returns an exit code on failure.
int open_registry(const std::string& path, Opened* out, bool load_lazy) {
  auto manifest = kreg::load_manifest(path, kreg::manifest_options_from_env());
  if (!manifest) {
    // Each diagnostic on a line of its own under the heading.
    return fail(kExitUsage, "kreg: cannot use manifest ", kreg::excerpt(path, 256), ":",
                message("\n" + manifest.status().message()));
  }
  auto reg = kreg::Registry::open(*manifest, kreg::OpenOptions{.load_lazy_groups = load_lazy});
  if (!reg) return fail(kExitFailed, "kreg: ", message(reg.status().message()));
  out->manifest = std::move(manifest).value();
  out->registry = std::move(reg).value();
  return 0;
}

std::string join(const std::vector<std::string>& v, const char* sep) {
  std::string s;
  for (const auto& x : v) s += (s.empty() ? "" : sep) + x;
  return s;
}

std::string backends_of(const kreg::Registry& reg, const std::string& op) {
  std::vector<std::string> b;
  for (const kreg::KernelSpec* s : reg.implementations(op)) b.push_back(s->backend);
  return join(b, ",");
}

// ---- list ----

int cmd_list(const std::string& manifest, const std::string& group, bool json) {
  Opened o;
  if (int rc = open_registry(manifest, &o, false)) return rc;
  const auto groups = o.registry->groups();
  if (json) {
    JsonWriter w(std::cout);
    w.begin_object().key("groups").begin_array();
    for (const auto& g : groups) {
      if (!group.empty() && g.name != group) continue;
      w.begin_object().field("name", g.name).field("loaded", g.loaded);
      w.field("source", kreg::group_source_name(g.source));
      if (!g.metadata_note.empty()) w.field("note", g.metadata_note);
      w.field("version", g.plugin ? g.plugin->version : std::string());
      w.field("generation", static_cast<long long>(g.generation));
      w.key("ops").begin_array();
      for (const auto& op : g.ops) {
        w.begin_object().field("op", op).key("implementations").begin_array();
        for (const kreg::KernelSpec* s : o.registry->implementations(op)) {
          w.begin_object().field("backend", s->backend).field("priority", s->priority);
          w.field("dtypes", kreg::dtype_set_name(s->dtypes)).field("traits", s->traits_string());
          w.end_object();
        }
        w.end_array().end_object();
      }
      w.end_array().end_object();
    }
    w.end_array().end_object();
    return 0;
  }
  bool found = group.empty();
  out << pad("GROUP", 11) << " " << pad("OP", 34) << " " << pad("BACKENDS", 10) << " "
      << pad("DTYPES", 14) << " TRAITS\n";
  for (const auto& g : groups) {
    if (!group.empty() && g.name != group) continue;
    found = true;
    // A lazy group without readable metadata (built before SDK 1.2): its ops are unknown
    // until it loads, which listing does not do.
    if (g.enabled && !g.loaded && g.source == kreg::GroupSource::kNone) {
      out << pad(g.name, 11) << " " << pad("(ops unknown until loaded)", 34) << " "
          << g.metadata_note << "\n";
    }
    for (const auto& op : g.ops) {
      const auto impls = o.registry->implementations(op);
      out << pad(g.name, 11) << " " << pad(op, 34) << " " << pad(backends_of(*o.registry, op), 10)
          << " " << pad(kreg::dtype_set_name(impls.front()->dtypes), 14) << " "
          << impls.front()->traits_string() << "\n";
    }
  }
  if (!found)
    return fail(kExitUsage, "kreg: no group named '", kreg::excerpt(group), "' in ", manifest);
  return kExitOk;
}

// ---- info ----

int cmd_info(const std::string& manifest, const std::string& op, bool json) {
  Opened o;
  if (int rc = open_registry(manifest, &o, false)) return rc;
  auto chain = o.registry->resolve_alias(op);
  std::string id = chain ? chain->op() : op;
  auto impls = o.registry->implementations(id);
  if (impls.empty()) {
    // Not loaded and not in any metadata: a lazy group without metadata may have it. A
    // resolve loads that one group (the op id names it) and nothing else; its selection
    // verdict does not matter here.
    auto loaded = o.registry->resolve(op, kreg::Target{});
    chain = o.registry->resolve_alias(op);
    id = chain ? chain->op() : op;
    impls = o.registry->implementations(id);
    // A group that failed to load says so (exit 1), not "unknown op".
    if (impls.empty() && !loaded && loaded.status().code() == KREG_UNAVAILABLE) {
      return fail(kExitFailed, "kreg: ", message(loaded.status().message()));
    }
  }
  if (impls.empty()) {
    if (chain) {
      return fail(kExitUsage, "kreg: unknown op '", kreg::excerpt(op),
                  "' (an alias: ", chain->text(), ", and no group registers ", id, ")");
    }
    return fail(kExitUsage, "kreg: unknown op '", kreg::excerpt(op), "'");
  }
  kreg::GroupInfo group;
  for (const auto& g : o.registry->groups()) {
    if (g.name == impls.front()->group()) group = g;
  }
  const std::string version = group.plugin ? group.plugin->version : std::string();
  if (json) {
    JsonWriter w(std::cout);
    w.begin_object().field("op", id);
    if (chain) {
      w.field("alias_of", id).field("deprecation", chain->message);
      w.strings("alias_chain", chain->names);
    }
    w.field("group", group.name).field("generation", static_cast<long long>(group.generation));
    w.field("plugin_version", version).field("source", kreg::group_source_name(group.source));
    w.key("implementations").begin_array();
    for (const kreg::KernelSpec* s : impls) {
      w.begin_object().field("backend", s->backend).field("priority", s->priority);
      w.field("signature", s->signature.text).field("dtypes", kreg::dtype_set_name(s->dtypes));
      w.key("capabilities").begin_array();
      for (const auto& c : s->capabilities) w.value(c.to_string());
      w.end_array();
      w.field("mutates", s->mutates()).field("graph_safe", s->graph_safe());
      w.field("deterministic", s->deterministic()).field("description", s->description);
      w.field("library", s->provenance.library).field("source", s->provenance.source_file);
      w.end_object();
    }
    w.end_array().end_object();
    return kExitOk;
  }
  out << id;
  if (chain) {
    out << "  (you asked for the deprecated alias " << op;
    if (chain->names.size() > 2) out << ", which leads here through " << chain->text();
    if (!chain->message.empty()) out << ": " << chain->message;
    out << ")";
  }
  out << "\n";
  out << "  group      " << group.name << " " << version << ", generation " << group.generation;
  if (group.source == kreg::GroupSource::kMetadata) out << " (not loaded: from its metadata)";
  out << "\n";
  const kreg::Signature& sig = impls.front()->signature;
  out << "  signature  " << sig.text << "\n";
  for (const auto& p : sig.params) {
    out << "    " << kreg::arg_kind_name(p.kind)
        << (p.kind == kreg::ArgKind::kResource ? "<" + p.resource_type + ">" : std::string()) << " "
        << p.name;
    if (p.is_tensor()) {
      out << " " << sig.shape_name(p);
      if (p.dtypes) out << " " << kreg::dtype_set_name(p.dtypes);
      if (p.written()) out << (p.read() ? " (read, written in place)" : " (written)");
    } else if (p.has_default) {
      out << " = " << p.default_text;
    }
    out << "\n";
  }
  for (const kreg::KernelSpec* s : impls) {
    out << "  [" << s->backend << "] priority " << s->priority << ", dtypes "
        << kreg::dtype_set_name(s->dtypes) << ", ";
    for (const auto& c : s->capabilities) out << c.to_string() << " ";
    if (s->flags & KREG_KERNEL_CAPS_FROM_BUILD) out << "(from the build) ";
    if (!s->provenance.cuda_images.empty()) {
      out << "\n      images " << kreg::terminal_safe(s->provenance.cuda_images);
    }
    out << "\n      traits " << s->traits_string() << "\n      " << s->description
        << "\n      from " << s->source() << "\n";
    const kreg::KernelBackend* b = kreg::find_backend(s->backend);
    out << "      launch: " << b->launch_semantics();
    if (!b->available()) out << "; unavailable here: " << b->unavailable_reason();
    out << "\n";
    if (s->jit) {
      out << "      jit: " << s->jit->source_name << ", specializes on "
          << join(s->jit->params, ",") << "; cached:";
      int n = 0;
      if (auto cache = kreg::jit::process_cache()) {
        if (auto entries = (*cache)->list()) {
          for (const auto& e : *entries) {
            if (!e.problem.empty() || e.meta.op != s->op) continue;
            out << (n++ ? ", " : " ") << e.meta.specialization << " " << e.meta.arch;
          }
        }
      }
      out << (n == 0 ? " none" : "") << "\n";
    }
  }
  return kExitOk;
}

// ---- validate ----

struct ValidateArgs {
  bool json = false;
  bool no_aliases = false;
  double timeout_s = 10;
  std::string plugins_src;
  std::string expect_groups;
  bool update_pins = false;
};

int cmd_validate(const std::string& manifest, const ValidateArgs& a) {
  kreg::ValidateOptions opts;
  opts.manifest = kreg::manifest_options_from_env();
  opts.forbid_aliases = a.no_aliases;
  opts.timeout_s = a.timeout_s;
  if (!a.plugins_src.empty()) {
    if (!fs::is_directory(a.plugins_src)) {
      return fail(kExitUsage, "kreg validate: --plugins-src ", a.plugins_src, " is not a folder");
    }
    opts.plugins_src = fs::path(a.plugins_src);
  }
  if (!a.expect_groups.empty()) {
    auto names = kreg::read_expect_groups(a.expect_groups);
    if (!names) {
      return fail(kExitUsage,
                  "kreg validate: --expect-groups: ", message(names.status().message()));
    }
    opts.expect_groups = *names;
    opts.expect_groups_source = a.expect_groups;
  }
  std::vector<kreg::PinUpdate> pinned;
  if (a.update_pins) {
    auto updates = kreg::update_pins(manifest, opts.manifest);
    if (!updates) {
      return fail(kExitUsage,
                  "kreg validate: --update-pins: ", message(updates.status().message()));
    }
    pinned = std::move(updates).value();
    for (const auto& u : pinned) {
      err << "kreg validate: pinned " << u.group << " sha256 " << u.sha256 << " ("
          << u.library.string();
      if (u.old_sha256) err << ", was " << *u.old_sha256;
      err << ")\n";
    }
    if (pinned.empty()) err << "kreg validate: every pin is up to date\n";
  }
  // A progress line on a terminal only: CI logs get the report alone.
  const bool tty = isatty(STDERR_FILENO);
  if (tty) {
    opts.progress = [](std::string_view group, size_t i, size_t n) {
      err << "\r\33[2Kkreg validate: [" << i + 1 << "/" << n << "] " << group << " ...";
      err.flush();
    };
  }
  const auto report = kreg::validate_registry(manifest, opts);
  if (tty) {
    err << "\r\33[2K";
    err.flush();
  }
  const int rc = !report.manifest_readable ? kExitUsage : report.ok() ? kExitOk : kExitFailed;
  if (a.json) {
    JsonWriter w(std::cout);
    w.begin_object().field("schema", "kreg.validate/1").field("manifest", manifest);
    w.field("ok", report.ok()).field("exit_code", rc);
    w.strings("groups", report.groups).field("ops", static_cast<long long>(report.ops));
    w.key("plugins_src");
    if (report.plugins_src.empty()) {
      w.null();
    } else {
      w.value(report.plugins_src.string());
    }
    w.field("timeout_s", a.timeout_s);
    w.key("checks").begin_array();
    for (const auto& c : report.outcomes) {
      w.begin_object().field("check", c.check).field("group", c.group).field("passed", c.passed);
      w.field("skipped", c.skipped).field("note", c.note).end_object();
    }
    w.end_array().key("violations").begin_array();
    for (const auto& f : report.findings) {
      w.begin_object().field("check", f.check).field("group", f.group).field("where", f.where);
      w.field("message", f.message).end_object();
    }
    w.end_array().key("warnings").begin_array();
    for (const auto& f : report.warnings) {
      w.begin_object().field("check", f.check).field("group", f.group).field("where", f.where);
      w.field("message", f.message).end_object();
    }
    w.end_array().key("pins_updated").begin_array();
    for (const auto& u : pinned) {
      w.begin_object().field("group", u.group).field("library", u.library.string());
      w.field("sha256", u.sha256).end_object();
    }
    w.end_array().end_object();
    std::cout << "\n";
    return rc;
  }
  const bool color = isatty(STDOUT_FILENO);
  const char* green = color ? "\33[32m" : "";
  const char* red = color ? "\33[31m" : "";
  const char* yellow = color ? "\33[33m" : "";
  const char* reset = color ? "\33[0m" : "";
  size_t passed = 0, skipped = 0;
  for (const auto& c : report.outcomes) {
    passed += c.passed && !c.skipped;
    skipped += c.skipped;
    const char* colour = c.skipped ? yellow : c.passed ? green : red;
    const char* label = c.skipped ? "skip" : c.passed ? "ok" : "FAIL";
    out << raw(colour) << pad(label, 4) << raw(reset) << " " << pad(c.check, 18) << " ";
    if (c.group.empty()) {
      out << "(registry)";
    } else {
      out << c.group;
    }
    if (!c.note.empty()) out << "  (" << c.note << ")";
    out << "\n";
  }
  // One line per violation: its fields are escaped whole, newlines included, so a message
  // can never start a line of its own.
  for (const auto& f : report.findings) {
    out << raw(red) << "error" << raw(reset) << " [" << f.check << "] ";
    if (!f.group.empty()) out << f.group << " ";
    out << kreg::excerpt(f.where, 256) << ": " << f.message << "\n";
  }
  for (const auto& f : report.warnings) {
    out << raw(yellow) << "warning" << raw(reset) << " [" << f.check << "] ";
    if (!f.group.empty()) out << f.group << " ";
    out << f.where << ": " << f.message << "\n";
  }
  out << passed << " checks passed, " << report.outcomes.size() - passed - skipped << " failed, "
      << skipped << " skipped; " << report.findings.size() << " violations, "
      << report.warnings.size() << " warnings; " << report.groups.size() << " groups, "
      << report.ops << " ops\n";
  return rc;
}

// ---- run / bench ----

struct RunArgs {
  std::string op, shape, dtype = "bf16", backend;
  std::vector<std::string> attrs;
  // Taken as text and parsed by kreg/parse_number.hpp: whole, in range, never wrapped
  // ("--seed -1" is an error, not 2^64-1).
  std::string seed_text = "1", reps_text = "100";
  uint64_t seed = 1;
  int reps = 100;
  bool bench = false;   // size checks for timing on the device instead of the reference run
  bool pdl = false;     // bench: ask for programmatic dependent launch (KREG_LAUNCH_PDL)
  bool stable = false;  // bench, with pdl: vouch for the op's stable inputs
                        // (KREG_LAUNCH_STABLE_INPUTS)
  // bench: each timed call follows a call of this op (--after), built from --after-shape
  std::string after, after_shape;
  std::string shape_flag = "--shape";  // the option `shape` came from, for messages
};

constexpr int kMaxReps = 1000000;

// --seed and --reps; prints the error and returns the usage exit code.
int parse_run_numbers(RunArgs* a) {
  auto seed = kreg::parse_uint(a->seed_text, "--seed");
  if (!seed) return fail(kExitUsage, "kreg: ", message(seed.status().message()));
  a->seed = *seed;
  auto reps = kreg::parse_int(a->reps_text, "--reps", 1, kMaxReps);
  if (!reps) return fail(kExitUsage, "kreg: ", message(reps.status().message()));
  a->reps = static_cast<int>(*reps);
  return kExitOk;
}

// --shape against the signature before anything runs: a dimension it lacks or one it does
// not have is the user's to fix (exit 2), not a failed run; so is an op with a required
// tensor that has no named shape to build example inputs from (an optional one is left
// absent: harness::left_absent).
int check_dimensions(const kreg::KernelSpec& spec, const kreg::harness::SymbolMap& symbols,
                     const std::string& flag) {
  const kreg::Signature& sig = spec.signature;
  std::string all;
  for (const std::string& s : sig.symbols) all += (all.empty() ? "" : ",") + s + "=N";
  for (const kreg::Param& p : sig.params) {
    if (p.is_tensor() && !p.ranked && !kreg::harness::left_absent(p)) {
      return fail(kExitUsage, "kreg: ", spec.op, ": tensor '", p.name,
                  "' has no named shape, so run and bench cannot build it (signature ", sig.text,
                  ")");
    }
  }
  for (const std::string& s : sig.symbols) {
    if (!symbols.count(s)) {
      return fail(kExitUsage, "kreg: ", spec.op, ": ", flag, " needs a size for '", s,
                  "' (signature ", sig.text, "; e.g. ", flag, " ", all, ")");
    }
  }
  for (const auto& [name, size] : symbols) {
    if (std::find(sig.symbols.begin(), sig.symbols.end(), name) == sig.symbols.end()) {
      return fail(kExitUsage, "kreg: ", spec.op, ": ", flag, " names '", kreg::excerpt(name),
                  "', which is not a dimension of its signature ", sig.text,
                  all.empty() ? " (it has none)" : "; e.g. " + flag + " " + all);
    }
  }
  return kExitOk;
}

int prepare(const std::string& manifest, const RunArgs& a, Opened* o, kreg::KernelHandle* h,
            kreg::harness::SymbolMap* symbols, kreg::DType* dtype, kreg::AttrList* attrs) {
  if (int rc = open_registry(manifest, o, true)) return rc;
  auto d = kreg::parse_dtype(a.dtype);
  if (!d) return fail(kExitUsage, "kreg: unknown --dtype '", kreg::excerpt(a.dtype), "'");
  *dtype = *d;
  auto sym = kreg::harness::parse_shape_spec(a.shape, a.shape_flag);
  if (!sym) return fail(kExitUsage, "kreg: ", message(sym.status().message()));
  *symbols = *sym;
  // Without --backend: on the GPU when there is one and the op has a GPU implementation,
  // where selection picks the best that runs (jit, else cuda); else the CPU reference.
  std::optional<std::string> backend;
  DLDevice device{kDLCPU, 0};
  if (!a.backend.empty()) {
    backend = a.backend;
    const kreg::KernelBackend* be = kreg::find_backend(a.backend);
    if (be == nullptr) {
      return fail(kExitUsage, "kreg: unknown --backend '", kreg::excerpt(a.backend),
                  "' (cpu, cuda, jit)");
    }
    // A machine without the backend is not the user's mistake: the run cannot happen here.
    if (!be->available()) {
      return fail(kExitFailed, "kreg: backend ", a.backend,
                  " is not available here: ", message(be->unavailable_reason()));
    }
    device.device_type = be->device_type();
  } else if (kreg::harness::gpu_available()) {
    // The op an alias chain leads to decides, like everywhere else.
    const auto chain = o->registry->resolve_alias(a.op);
    for (const kreg::KernelSpec* s : o->registry->implementations(chain ? chain->op() : a.op)) {
      if (s->device_type() == kDLCUDA) device.device_type = kDLCUDA;
    }
  }
  // The dimensions go with the target: a jit implementation is compiled for them.
  kreg::Target target{device, *d, *symbols};
  auto handle = o->registry->resolve(a.op, target, kreg::ResolveOptions{backend});
  if (!handle) {
    return fail(exit_code_for(handle.status()), "kreg: ", message(handle.status().message()));
  }
  *h = *handle;
  if (int rc = check_dimensions(h->spec(), *symbols, a.shape_flag)) return rc;
  // Sizes overflow-checked and compared with free memory before anything is allocated.
  if (kreg::Status st = kreg::harness::check_example_fits(
          h->spec(), *symbols, *d, DLDevice{static_cast<DLDeviceType>(h->spec().device_type()), 0},
          !a.bench);
      !st.ok()) {
    return fail(kExitUsage, "kreg: ", message(st.message()));
  }
  std::vector<kreg::NamedAttr> named;
  for (const std::string& kv : a.attrs) {
    const size_t eq = kv.find('=');
    if (eq == std::string::npos) {
      return fail(kExitUsage, "kreg: --attr '", kreg::excerpt(kv), "' is not NAME=VALUE");
    }
    const std::string name = kv.substr(0, eq), value = kv.substr(eq + 1);
    for (const kreg::NamedAttr& earlier : named) {
      if (earlier.name == name) {
        return fail(kExitUsage, "kreg: --attr ", kreg::excerpt(name, 60), " is given twice");
      }
    }
    const kreg::Param* p = h->spec().signature.find(name);
    if (p && p->kind == kreg::ArgKind::kResource) {
      return fail(kExitUsage, "kreg: --attr ", kreg::excerpt(name, 60), ": a resource (",
                  p->resource_type,
                  ") cannot be given on the command line; run and bench "
                  "create a default one");
    }
    kreg::NamedAttr na{name, value};
    const std::string what = "--attr " + kreg::excerpt(name, 60);
    kreg::Status bad;
    if (p && p->kind == kreg::ArgKind::kFloat) {
      auto v = kreg::parse_float(value, what);
      if (v)
        na.value = *v;
      else
        bad = v.status();
    } else if (p && p->kind == kreg::ArgKind::kInt) {
      auto v = kreg::parse_int(value, what);
      if (v)
        na.value = *v;
      else
        bad = v.status();
    } else if (p && p->kind == kreg::ArgKind::kBool) {
      auto v = kreg::parse_bool(value, what);
      if (v)
        na.value = *v;
      else
        bad = v.status();
    }
    if (!bad.ok()) {
      return fail(kExitUsage, "kreg: ", message(bad.message()), " (an attribute of ", h->op(), ")");
    }
    named.push_back(std::move(na));
  }
  // A Resource<...> parameter gets a resource of that type with its default parameters
  // (for communication.comm: one rank, no store), on the target's device when the type
  // takes a `device`.
  for (const kreg::Param& p : h->spec().signature.params) {
    if (p.kind != kreg::ArgKind::kResource) continue;
    std::vector<kreg::NamedAttr> params;
    for (const kreg::ResourceTypeInfo& t : o->registry->resource_types()) {
      if (t.type == p.resource_type && t.signature.find("int device") != std::string::npos &&
          h->spec().device_type() == kDLCUDA) {
        params.push_back({"device", int64_t{0}});
      }
    }
    auto r = o->registry->create_resource(p.resource_type, params);
    if (!r) return fail(kExitFailed, "kreg: ", message(r.status().message()));
    named.push_back({p.name, kreg::ResourceArg{r->get()}});
    o->resources.push_back(std::move(r).value());
  }
  auto list = h->attrs(named);
  if (!list) return fail(kExitUsage, "kreg: ", message(list.status().message()));
  *attrs = std::move(list).value();
  return kExitOk;
}

// "  indices    absent (optional, no named shape to build it from)": one line per tensor
// the example leaves out, so a report never hides what was not passed.
void print_absent(const kreg::KernelSpec& spec) {
  for (const std::string& name : kreg::harness::absent_tensors(spec)) {
    out << "  " << pad(name, 10) << " absent (optional, no named shape to build it from)\n";
  }
}

int cmd_run(const std::string& manifest, const RunArgs& a) {
  Opened o;
  kreg::KernelHandle h;
  kreg::harness::SymbolMap symbols;
  kreg::DType dtype;
  kreg::AttrList attrs;
  if (int rc = prepare(manifest, a, &o, &h, &symbols, &dtype, &attrs)) return rc;
  auto result =
      kreg::harness::check_against_reference(*o.registry, h, symbols, dtype, attrs, a.seed);
  if (!result) return fail(kExitFailed, "kreg: ", message(result.status().message()));
  bool ok = true;
  out << h.op() << " [" << h.backend() << "] " << a.shape << " " << kreg::dtype_name(dtype)
      << ", seed " << a.seed << ", vs cpu reference\n";
  print_absent(h.spec());
  for (const auto& c : *result) {
    ok = ok && c.ok();
    out << "  " << pad(c.tensor, 10) << " max_abs_err " << num("%.3g", c.max_abs)
        << "  max_rel_err " << num("%.3g", c.max_rel) << "  mismatches " << c.mismatches << "/"
        << c.count << "  " << (c.ok() ? "OK" : "MISMATCH") << "\n";
  }
  return ok ? kExitOk : kExitFailed;
}

int cmd_bench(const std::string& manifest, const RunArgs& a) {
  const bool gpu = kreg::harness::gpu_available();
  RunArgs ra = a;
  ra.bench = true;
  if (const kreg::KernelBackend* be = kreg::find_backend(ra.backend);
      be != nullptr && be->device_type() == kDLCPU) {
    return fail(kExitUsage, "kreg bench: times GPU kernels; --backend ", kreg::excerpt(ra.backend),
                " runs on the CPU (use kreg run to check it)");
  }
  // Without a GPU the arguments are still checked, against the CPU implementation, so a
  // usage error is one on every machine.
  if (ra.backend.empty() && !gpu) ra.backend = "cpu";
  Opened o;
  kreg::KernelHandle h;
  kreg::harness::SymbolMap symbols;
  kreg::DType dtype;
  kreg::AttrList attrs;
  if (int rc = prepare(manifest, ra, &o, &h, &symbols, &dtype, &attrs)) return rc;
  // --after: the producer, with its own shape and default attributes, checked like the op
  // (on the CPU reference where there is no GPU).
  Opened po;
  kreg::KernelHandle ph;
  kreg::harness::Producer producer;
  kreg::AttrList pattrs;
  if (!a.after.empty()) {
    RunArgs pa;
    pa.op = a.after;
    pa.shape = a.after_shape;
    pa.shape_flag = "--after-shape";
    pa.dtype = a.dtype;
    pa.backend = ra.backend;
    pa.bench = true;
    if (int rc = prepare(manifest, pa, &po, &ph, &producer.symbols, &producer.dtype, &pattrs)) {
      return rc;
    }
    producer.handle = &ph;
    producer.attrs = &pattrs;
  }
  if (!gpu) {
    return fail(kExitFailed,
                "kreg bench: no CUDA device here (bench times GPU kernels with CUDA events)");
  }
  // Correctness first, at the same widths with the leading dimension symbol clamped to
  // 256: the CPU reference at full benchmark size would take minutes.
  kreg::harness::SymbolMap check_symbols = symbols;
  const auto& sig = h.spec().signature;
  if (!sig.symbols.empty()) {
    int64_t& lead = check_symbols[sig.symbols.front()];
    lead = std::min<int64_t>(lead, 256);
  }
  auto check =
      kreg::harness::check_against_reference(*o.registry, h, check_symbols, dtype, attrs, a.seed);
  if (!check) return fail(kExitFailed, "kreg: ", message(check.status().message()));
  for (const auto& c : *check) {
    if (!c.ok()) {
      return fail(kExitFailed, "kreg bench: ", h.op(), " disagrees with the CPU reference on '",
                  c.tensor, "' (", c.mismatches, " mismatches); not timing a wrong kernel");
    }
  }
  std::string checked = "checked vs cpu reference";
  for (const auto& [name, v] : check_symbols) checked += " " + name + "=" + std::to_string(v);
  auto copy = kreg::harness::copy_bandwidth_gbps(size_t{1} << 30);
  if (!copy) return fail(kExitFailed, "kreg: ", message(copy.status().message()));
  const uint64_t flags = (a.pdl ? uint64_t{KREG_LAUNCH_PDL} : 0) |
                         (a.stable ? uint64_t{KREG_LAUNCH_STABLE_INPUTS} : 0);
  auto t = kreg::harness::time_on_gpu(h, symbols, dtype, attrs, a.reps, a.seed, flags,
                                      a.after.empty() ? nullptr : &producer);
  if (!t) return fail(kExitFailed, "kreg: ", message(t.status().message()));
  if (!a.after.empty()) {
    // The producer alone, timed the same way: the op's share of a pair is the difference.
    auto p = kreg::harness::time_on_gpu(ph, producer.symbols, producer.dtype, pattrs, a.reps,
                                        a.seed + 1, flags & KREG_LAUNCH_PDL);
    if (!p) return fail(kExitFailed, "kreg: ", message(p.status().message()));
    out << h.op() << " [" << h.backend() << "] " << a.shape << " " << kreg::dtype_name(dtype)
        << " after " << ph.op() << " " << a.after_shape << " on " << kreg::harness::gpu_name()
        << "\n";
    const double share = t->median_us - p->median_us;
    out << "  median " << num("%.2f", t->median_us) << " us a pair (min " << num("%.2f", t->min_us)
        << "), " << ph.op() << " alone " << num("%.2f", p->median_us) << " us: the op's share "
        << num("%.2f", share) << " us, " << t->bytes << " bytes, "
        << num("%.0f", share > 0 ? static_cast<double>(t->bytes) / (share * 1e3) : 0.0) << " GB/s ["
        << t->buffer_sets << " buffer sets" << (t->graph ? ", CUDA graph" : "") << ", " << a.reps
        << " reps" << (a.pdl ? ", PDL" : "") << (a.stable ? ", stable inputs" : "") << "]\n";
    print_absent(h.spec());
    out << "  " << checked << ": OK\n";
    return kExitOk;
  }
  out << h.op() << " [" << h.backend() << "] " << a.shape << " " << kreg::dtype_name(dtype)
      << " on " << kreg::harness::gpu_name() << "\n";
  out << "  median " << num("%.2f", t->median_us) << " us (min " << num("%.2f", t->min_us) << "), "
      << t->bytes << " bytes, " << num("%.0f", t->gbps)
      << " GB/s = " << num("%.1f", 100.0 * t->gbps / *copy) << "% of copy " << num("%.0f", *copy)
      << " GB/s [" << t->buffer_sets << " buffer sets" << (t->graph ? ", CUDA graph" : "") << ", "
      << a.reps << " reps" << (a.pdl ? ", PDL" : "") << (a.stable ? ", stable inputs" : "")
      << "]\n";
  print_absent(h.spec());
  out << "  " << checked << ": OK\n";
  return kExitOk;
}

// ---- jit (docs/jit.md) ----

struct JitArgs {
  std::vector<std::string> ops;
  std::string arch;
  std::vector<std::string> shapes;
  std::vector<std::string> dtypes;
  bool json = false;
};

// "2.1 MB", "380 KB", "12 B"
std::string human_bytes(uint64_t n) {
  char buf[32];
  if (n >= 1000000) {
    std::snprintf(buf, sizeof buf, "%.1f MB", static_cast<double>(n) / 1e6);
  } else if (n >= 1000) {
    std::snprintf(buf, sizeof buf, "%.0f KB", static_cast<double>(n) / 1e3);
  } else {
    std::snprintf(buf, sizeof buf, "%llu B", static_cast<unsigned long long>(n));
  }
  return buf;
}

// "3 s", "5 min", "2 h", "4 d" since `t`.
std::string age_of(fs::file_time_type t) {
  const auto s =
      std::chrono::duration_cast<std::chrono::seconds>(fs::file_time_type::clock::now() - t)
          .count();
  if (s < 120) return std::to_string(std::max<long long>(0, s)) + " s";
  if (s < 7200) return std::to_string(s / 60) + " min";
  if (s < 172800) return std::to_string(s / 3600) + " h";
  return std::to_string(s / 86400) + " d";
}

int open_jit_cache(kreg::jit::Cache** cache) {
  auto c = kreg::jit::process_cache();
  if (!c) return fail(kExitUsage, "kreg jit: no cache directory: ", message(c.status().message()));
  *cache = *c;
  return kExitOk;
}

int cmd_jit_build(const std::string& manifest, const JitArgs& a) {
  Opened o;
  if (int rc = open_registry(manifest, &o, true)) return rc;
  std::string arch = a.arch;
  if (arch.empty()) {
    const auto sm = kreg::find_backend("cuda")->sm_of(0);
    if (!sm)
      return fail(
          kExitUsage,
          "kreg jit build: no GPU here to take the architecture from: give --arch (e.g. sm_90a)");
    arch = kreg::jit::arch_name(*sm);
  }
  if (auto v = kreg::jit::nvrtc_version(); !v) {
    return fail(kExitFailed, "kreg jit build: ", message(v.status().message()));
  }
  kreg::jit::Cache* cache = nullptr;
  if (int rc = open_jit_cache(&cache)) return rc;
  std::vector<kreg::harness::SymbolMap> shapes;
  for (const std::string& text : a.shapes) {
    auto sym = kreg::harness::parse_shape_spec(text);
    if (!sym) return fail(kExitUsage, "kreg jit build: ", message(sym.status().message()));
    shapes.push_back(*sym);
  }
  std::vector<kreg::DType> dtypes;
  for (const std::string& text : a.dtypes) {
    auto d = kreg::parse_dtype(text);
    if (!d) return fail(kExitUsage, "kreg jit build: unknown --dtype '", kreg::excerpt(text), "'");
    dtypes.push_back(*d);
  }
  // What to build: every jit implementation of the ops asked for (default: all), for
  // every --shape and every --dtype (default: each dtype the implementation takes).
  std::vector<std::string> ops = a.ops;
  if (ops.empty()) {
    for (const auto& g : o.registry->groups()) ops.insert(ops.end(), g.ops.begin(), g.ops.end());
  }
  struct Item {
    const kreg::KernelSpec* spec;
    kreg::jit::Specialization values;
  };
  std::vector<Item> items;
  for (const std::string& op : ops) {
    const auto chain = o.registry->resolve_alias(op);
    const auto impls = o.registry->implementations(chain ? chain->op() : op);
    if (impls.empty()) {
      return fail(kExitUsage, "kreg jit build: unknown op '", kreg::excerpt(op), "'");
    }
    bool any = false;
    for (const kreg::KernelSpec* s : impls) {
      if (!s->jit) continue;
      any = true;
      if (shapes.empty()) {
        return fail(kExitUsage, "kreg jit build: ", s->op, " specializes on ",
                    join(s->jit->params, ","), ": give --shape (e.g. --shape H=4096)");
      }
      std::vector<kreg::DType> ds = dtypes;
      if (ds.empty()) {
        for (int d = 0; d < static_cast<int>(kreg::DType::kCount); ++d) {
          if (s->dtypes & kreg::mask_of(static_cast<kreg::DType>(d)))
            ds.push_back(static_cast<kreg::DType>(d));
        }
      }
      for (const auto& shape : shapes) {
        for (kreg::DType d : ds) {
          auto values = kreg::jit::specialize(*s, shape, d);
          if (!values)
            return fail(kExitUsage, "kreg jit build: ", message(values.status().message()));
          items.push_back({s, std::move(values).value()});
        }
      }
    }
    if (!any && !a.ops.empty())
      return fail(kExitUsage, "kreg jit build: ", kreg::excerpt(op), " has no jit implementation");
  }
  if (items.empty()) return fail(kExitUsage, "kreg jit build: no jit implementation to build");
  const bool bar = items.size() > 1 && isatty(STDERR_FILENO);
  int failed = 0;
  for (size_t i = 0; i < items.size(); ++i) {
    const Item& it = items[i];
    if (bar) {
      const size_t width = 30, done = width * i / items.size();
      err << "\r\33[2K[" << std::string(done, '#') << std::string(width - done, '.') << "] " << i
          << "/" << items.size() << " " << it.spec->op;
      err.flush();
    }
    auto c = kreg::jit::build(*it.spec, *it.spec->jit, it.values, arch, *cache);
    if (bar) {
      err << "\r\33[2K";
      err.flush();
    }
    if (!c) {
      // The arguments themselves (an --arch NVRTC does not compile for): every item would
      // fail the same way, and the first build checks them before compiling anything.
      if (c.status().code() == KREG_INVALID_ARGUMENT) {
        return fail(kExitUsage, "kreg jit build: ", message(c.status().message()));
      }
      ++failed;
      err << "kreg jit build: " << message(c.status().message()) << "\n";
      continue;
    }
    if (!c->note.empty()) err << "kreg jit: " << c->note << "\n";
    out << pad(c->compiled ? "compiled" : "cached", 9) << " " << c->key.substr(0, 16) << "  "
        << pad(it.spec->op, 34) << " " << pad(it.values.text(), 22) << " " << arch << "  "
        << num("%.3f", c->seconds) << " s  " << human_bytes(c->cubin.size()) << "\n";
  }
  out << items.size() - failed << " of " << items.size() << " specializations in "
      << cache->dir().string() << "\n";
  return failed == 0 ? kExitOk : kExitFailed;
}

int cmd_jit_ls(bool json) {
  kreg::jit::Cache* cache = nullptr;
  if (int rc = open_jit_cache(&cache)) return rc;
  auto entries = cache->list();
  if (!entries) return fail(kExitFailed, "kreg jit ls: ", message(entries.status().message()));
  if (json) {
    JsonWriter w(std::cout);
    w.begin_object().field("cache", cache->dir().string()).key("entries").begin_array();
    for (const auto& e : *entries) {
      w.begin_object().field("key", e.key).field("op", e.meta.op);
      w.field("specialization", e.meta.specialization).field("arch", e.meta.arch);
      w.field("size", static_cast<long long>(e.size)).field("problem", e.problem).end_object();
    }
    w.end_array().end_object();
    return kExitOk;
  }
  out << pad("KEY", 16) << "  " << pad("OP", 34) << " " << pad("SPECIALIZATION", 22) << " "
      << pad("ARCH", 7) << " " << pad("SIZE", 8) << " AGE\n";
  for (const auto& e : *entries) {
    if (!e.problem.empty()) {
      out << pad(e.key.substr(0, 16), 16) << "  invalid: " << e.problem << "\n";
      continue;
    }
    out << pad(e.key.substr(0, 16), 16) << "  " << pad(e.meta.op, 34) << " "
        << pad(e.meta.specialization, 22) << " " << pad(e.meta.arch, 7) << " "
        << pad(human_bytes(e.size), 8) << " " << age_of(e.mtime) << "\n";
  }
  out << entries->size() << " entries in " << cache->dir().string() << "\n";
  return kExitOk;
}

int cmd_jit_clear() {
  kreg::jit::Cache* cache = nullptr;
  if (int rc = open_jit_cache(&cache)) return rc;
  auto n = cache->clear();
  if (!n) return fail(kExitFailed, "kreg jit clear: ", message(n.status().message()));
  out << "removed " << *n << " entries from " << cache->dir().string() << "\n";
  return kExitOk;
}

// CLI11's help is its own text with the environment's defaults in it: out line by line
// through the printer. Its errors quote the command line, newlines included, so an error
// is one escaped line.
int cli_exit(const CLI::App& app, const CLI::Error& e, int code) {
  if (code != kExitOk) {
    return fail(code, "kreg: ", e.what(), "\nRun with --help for more information.");
  }
  std::ostringstream help, error;
  app.exit(e, help, error);
  for (auto [text, printer] : {std::pair{help.str(), &out}, std::pair{error.str(), &err}}) {
    std::string_view rest = text;
    while (!rest.empty()) {
      const size_t eol = rest.find('\n');
      *printer << rest.substr(0, eol) << "\n";
      if (eol == std::string_view::npos) break;
      rest.remove_prefix(eol + 1);
    }
  }
  return code;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"kreg: the GPU kernel registry's command line"};
  std::string manifest = default_manifest();
  app.add_option("--manifest", manifest,
                 "registry manifest (default $KREG_MANIFEST or ./registry.yaml)");
  app.require_subcommand(1);
  // Subcommands inherit this: `kreg list --manifest X` works as well as `kreg --manifest X list`.
  app.fallthrough();

  bool json = false;
  std::string group;
  auto* list = app.add_subcommand("list", "list groups, ops and their backends");
  list->add_option("--group", group, "only this group");
  list->add_flag("--json", json, "machine-readable output");

  std::string op;
  auto* info = app.add_subcommand("info", "show everything about one op");
  info->add_option("op", op, "op id, e.g. layernorm.rmsnorm")->required();
  info->add_flag("--json", json, "machine-readable output");

  ValidateArgs va;
  auto* validate = app.add_subcommand("validate", "check the manifest and every plugin (CI gate)");
  validate->add_flag("--json", va.json, "machine-readable report (schema kreg.validate/1)");
  validate->add_flag("--no-aliases", va.no_aliases, "treat every alias as a violation");
  validate
      ->add_option("--timeout", va.timeout_s,
                   "seconds a plugin's child process may take to load, init and unload "
                   "(default 10)")
      ->check(kreg::cli::finite_range(0.001, 86400));
  validate->add_option("--plugins-src", va.plugins_src,
                       "plugin source tree for groups-guard and sources-built (default: the "
                       "plugins folder next to the manifest)");
  validate->add_option("--expect-groups", va.expect_groups,
                       "file listing the exact groups the manifest must have, one per line");
  validate->add_flag("--update-pins", va.update_pins,
                     "first write each library's sha256 into the manifest (comments kept)");

  RunArgs ra;
  auto add_run_options = [&](CLI::App* sub) {
    sub->add_option("op", ra.op, "op id")->required();
    sub->add_option("--shape", ra.shape, "named dimensions, e.g. T=64,H=4096")->required();
    sub->add_option("--dtype", ra.dtype, "dtype of the shared tensors (bf16, f16, f32)");
    sub->add_option("--backend", ra.backend,
                    "implementation to run (default: cuda if a GPU exists)");
    sub->add_option("--attr", ra.attrs, "attribute NAME=VALUE (repeatable)");
    sub->add_option("--seed", ra.seed_text, "random seed for inputs, in [0, 2^64-1]");
  };
  auto* run =
      app.add_subcommand("run", "run an op on random inputs and compare with the CPU reference");
  add_run_options(run);
  auto* bench =
      app.add_subcommand("bench", "time an op on the GPU (CUDA events) against a D2D copy");
  add_run_options(bench);
  bench->add_option("--reps", ra.reps_text, "timed repetitions (median reported), in [1, 1000000]");
  auto* pdl_flag = bench->add_flag(
      "--pdl", ra.pdl, "launch with programmatic dependent launch (sm90+; kernels that honour it)");
  bench
      ->add_flag("--stable-inputs", ra.stable,
                 "with --pdl: vouch that the op's stable inputs (docs/kernels.md) are not the "
                 "previous kernel's output, so kernels may read them before waiting for it")
      ->needs(pdl_flag);
  auto* after_opt = bench->add_option(
      "--after", ra.after,
      "time each call behind a call of this op (a chain as a model step runs it, e.g. the rope "
      "before a decode); reports the pair, the producer alone and the difference");
  bench
      ->add_option("--after-shape", ra.after_shape,
                   "the --after op's dimensions, as --shape (its attributes take their defaults)")
      ->needs(after_opt);
  after_opt->needs("--after-shape");

  JitArgs ja;
  auto* jit =
      app.add_subcommand("jit", "the JIT cache: build ahead of time, list, clear (docs/jit.md)");
  jit->require_subcommand(1);
  auto* jit_build =
      jit->add_subcommand("build", "compile jit specializations into the cache (no GPU needed)");
  jit_build->add_option("--op", ja.ops,
                        "op id (repeatable; default: every op with a jit implementation)");
  jit_build->add_option("--arch", ja.arch, "target architecture, e.g. sm_90a (default: the GPU's)");
  jit_build->add_option("--shape", ja.shapes,
                        "dimension values, e.g. H=4096 (repeatable: one specialization each)");
  jit_build->add_option("--dtype", ja.dtypes,
                        "dtype (repeatable; default: every dtype the op takes)");
  auto* jit_ls =
      jit->add_subcommand("ls", "list the cache: key, op, specialization, arch, size, age");
  jit_ls->add_flag("--json", ja.json, "machine-readable output");
  auto* jit_clear = jit->add_subcommand("clear", "remove every cached specialization");

  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return cli_exit(app, e, kExitOk);
  } catch (const CLI::CallForAllHelp& e) {
    return cli_exit(app, e, kExitOk);
  } catch (const CLI::ParseError& e) {
    return cli_exit(app, e, kExitUsage);
  }
  if (*list) return cmd_list(manifest, group, json);
  if (*info) return cmd_info(manifest, op, json);
  if (*validate) return cmd_validate(manifest, va);
  if (*jit_build) return cmd_jit_build(manifest, ja);
  if (*jit_ls) return cmd_jit_ls(ja.json);
  if (*jit_clear) return cmd_jit_clear();
  if (*run || *bench) {
    if (int rc = parse_run_numbers(&ra)) return rc;
  }
  if (*run) return cmd_run(manifest, ra);
  if (*bench) return cmd_bench(manifest, ra);
  return kExitUsage;
}
