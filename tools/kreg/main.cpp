// kreg: the registry's command line. list, info, validate, run, bench.
// Exit codes: 0 success, 1 a violation / mismatch / failed run, 2 usage error or a
// manifest that cannot be read.
#include <algorithm>
#include <cstdlib>
#include <iostream>
#include <sstream>

#include <unistd.h>
#include <CLI/CLI.hpp>

#include "harness.hpp"
#include "json.hpp"
#include "kreg/parse_number.hpp"
#include "kreg/registry.hpp"
#include "kreg/text.hpp"
#include "kreg/validation.hpp"

namespace fs = std::filesystem;
using kreg::cli::JsonWriter;

namespace {

constexpr int kExitViolation = 1;
constexpr int kExitUsage = 2;

std::string default_manifest() {
  const char* env = std::getenv("KREG_MANIFEST");
  return env && *env ? env : "registry.yaml";
}

struct Opened {
  kreg::Manifest manifest;
  std::unique_ptr<kreg::Registry> registry;
};

// Loads the manifest and every enabled group (lazy ones too). Prints and returns an exit
// code on failure.
int open_registry(const std::string& path, Opened* out) {
  auto manifest = kreg::load_manifest(path, kreg::manifest_options_from_env());
  if (!manifest) {
    std::cerr << "kreg: cannot use manifest " << path << ":\n"
              << manifest.status().message() << "\n";
    return kExitUsage;
  }
  auto reg = kreg::Registry::open(*manifest, kreg::OpenOptions{.load_lazy_groups = true});
  if (!reg) {
    std::cerr << "kreg: " << reg.status().message() << "\n";
    return kExitViolation;
  }
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
  if (int rc = open_registry(manifest, &o)) return rc;
  const auto groups = o.registry->groups();
  if (json) {
    JsonWriter w(std::cout);
    w.begin_object().key("groups").begin_array();
    for (const auto& g : groups) {
      if (!group.empty() && g.name != group) continue;
      w.begin_object().field("name", g.name).field("loaded", g.loaded);
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
  std::printf("%-11s %-34s %-10s %-14s %s\n", "GROUP", "OP", "BACKENDS", "DTYPES", "TRAITS");
  for (const auto& g : groups) {
    if (!group.empty() && g.name != group) continue;
    found = true;
    for (const auto& op : g.ops) {
      const auto impls = o.registry->implementations(op);
      std::printf("%-11s %-34s %-10s %-14s %s\n", g.name.c_str(), op.c_str(),
                  backends_of(*o.registry, op).c_str(),
                  kreg::dtype_set_name(impls.front()->dtypes).c_str(),
                  impls.front()->traits_string().c_str());
    }
  }
  if (!found) {
    std::cerr << "kreg: no group named '" << group << "' in " << manifest << "\n";
    return kExitUsage;
  }
  return 0;
}

// ---- info ----

int cmd_info(const std::string& manifest, const std::string& op, bool json) {
  Opened o;
  if (int rc = open_registry(manifest, &o)) return rc;
  std::string id = op;
  std::string alias_note;
  if (auto a = o.registry->alias(op)) {
    id = a->first;
    alias_note = a->second;
  }
  const auto impls = o.registry->implementations(id);
  if (impls.empty()) {
    std::cerr << "kreg: unknown op '" << op << "'\n";
    return kExitUsage;
  }
  kreg::GroupInfo group;
  for (const auto& g : o.registry->groups()) {
    if (g.name == impls.front()->group()) group = g;
  }
  if (json) {
    JsonWriter w(std::cout);
    w.begin_object().field("op", id);
    if (id != op) w.field("alias_of", id).field("deprecation", alias_note);
    w.field("group", group.name).field("generation", static_cast<long long>(group.generation));
    w.field("plugin_version", group.plugin ? group.plugin->version : std::string());
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
    return 0;
  }
  std::cout << id
            << (id != op ? "  (you asked for the deprecated alias " + op + ": " + alias_note + ")"
                         : "")
            << "\n";
  std::cout << "  group      " << group.name << " " << (group.plugin ? group.plugin->version : "")
            << ", generation " << group.generation << "\n";
  std::cout << "  signature  " << impls.front()->signature.text << "\n";
  for (const auto& p : impls.front()->signature.params) {
    std::cout << "    " << std::string(kreg::arg_kind_name(p.kind)) << " " << p.name;
    if (p.is_tensor()) {
      std::cout << " " << impls.front()->signature.shape_name(p)
                << (p.dtypes ? " " + kreg::dtype_set_name(p.dtypes) : "")
                << (p.written() ? (p.read() ? " (read, written in place)" : " (written)") : "");
    } else if (p.has_default) {
      std::cout << " = " << p.default_text;
    }
    std::cout << "\n";
  }
  for (const kreg::KernelSpec* s : impls) {
    std::cout << "  [" << s->backend << "] priority " << s->priority << ", dtypes "
              << kreg::dtype_set_name(s->dtypes) << ", ";
    for (const auto& c : s->capabilities) std::cout << c.to_string() << " ";
    std::cout << "\n      traits " << s->traits_string() << "\n      " << s->description
              << "\n      from " << s->source() << "\n";
    const kreg::KernelBackend* b = kreg::find_backend(s->backend);
    std::cout << "      launch: " << b->launch_semantics()
              << (b->available() ? "" : "; unavailable here: " + b->unavailable_reason()) << "\n";
  }
  return 0;
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
      std::cerr << "kreg validate: --plugins-src " << a.plugins_src << " is not a folder\n";
      return kExitUsage;
    }
    opts.plugins_src = fs::path(a.plugins_src);
  }
  if (!a.expect_groups.empty()) {
    auto names = kreg::read_expect_groups(a.expect_groups);
    if (!names) {
      std::cerr << "kreg validate: --expect-groups: " << names.status().message() << "\n";
      return kExitUsage;
    }
    opts.expect_groups = *names;
    opts.expect_groups_source = a.expect_groups;
  }
  std::vector<kreg::PinUpdate> pinned;
  if (a.update_pins) {
    auto updates = kreg::update_pins(manifest, opts.manifest);
    if (!updates) {
      std::cerr << "kreg validate: --update-pins: " << updates.status().message() << "\n";
      return kExitUsage;
    }
    pinned = std::move(updates).value();
    for (const auto& u : pinned) {
      std::cerr << "kreg validate: pinned " << u.group << " sha256 " << u.sha256 << " ("
                << u.library.string() << (u.old_sha256 ? ", was " + *u.old_sha256 : "") << ")\n";
    }
    if (pinned.empty()) std::cerr << "kreg validate: every pin is up to date\n";
  }
  // A progress line on a terminal only: CI logs get the report alone.
  const bool tty = isatty(STDERR_FILENO);
  if (tty) {
    opts.progress = [](std::string_view group, size_t i, size_t n) {
      std::cerr << "\r\33[2Kkreg validate: [" << i + 1 << "/" << n << "] " << group << " ..."
                << std::flush;
    };
  }
  const auto report = kreg::validate_registry(manifest, opts);
  if (tty) std::cerr << "\r\33[2K" << std::flush;
  const int rc = !report.manifest_readable ? kExitUsage : report.ok() ? 0 : kExitViolation;
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
    std::printf("%s%-4s%s %-18s %s%s%s%s\n", colour, label, reset, c.check.c_str(),
                c.group.empty() ? "(registry)" : c.group.c_str(), c.note.empty() ? "" : "  (",
                c.note.c_str(), c.note.empty() ? "" : ")");
  }
  for (const auto& f : report.findings) {
    std::printf("%serror%s [%s] %s%s: %s\n", red, reset, f.check.c_str(),
                f.group.empty() ? "" : (f.group + " ").c_str(), f.where.c_str(), f.message.c_str());
  }
  std::printf("%zu checks passed, %zu failed, %zu skipped; %zu violations; %zu groups, %zu ops\n",
              passed, report.outcomes.size() - passed - skipped, skipped, report.findings.size(),
              report.groups.size(), report.ops);
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
  bool bench = false;  // size checks for timing on the device instead of the reference run
};

constexpr int kMaxReps = 1000000;

// --seed and --reps; prints the error and returns the usage exit code.
int parse_run_numbers(RunArgs* a) {
  auto seed = kreg::parse_uint(a->seed_text, "--seed");
  if (!seed) {
    std::cerr << "kreg: " << seed.status().message() << "\n";
    return kExitUsage;
  }
  a->seed = *seed;
  auto reps = kreg::parse_int(a->reps_text, "--reps", 1, kMaxReps);
  if (!reps) {
    std::cerr << "kreg: " << reps.status().message() << "\n";
    return kExitUsage;
  }
  a->reps = static_cast<int>(*reps);
  return 0;
}

int prepare(const std::string& manifest, const RunArgs& a, Opened* o, kreg::KernelHandle* h,
            kreg::harness::SymbolMap* symbols, kreg::DType* dtype, kreg::AttrList* attrs) {
  if (int rc = open_registry(manifest, o)) return rc;
  auto d = kreg::parse_dtype(a.dtype);
  if (!d) {
    std::cerr << "kreg: unknown --dtype '" << a.dtype << "'\n";
    return kExitUsage;
  }
  *dtype = *d;
  auto sym = kreg::harness::parse_shape_spec(a.shape);
  if (!sym) {
    std::cerr << "kreg: " << sym.status().message() << "\n";
    return kExitUsage;
  }
  *symbols = *sym;
  std::string backend = a.backend;
  if (backend.empty()) {
    backend = kreg::harness::gpu_available() && !o->registry->implementations(a.op).empty() &&
                      o->registry->implementations(a.op).front()->backend == "cuda"
                  ? "cuda"
                  : "cpu";
  }
  const kreg::KernelBackend* be = kreg::find_backend(backend);
  if (be == nullptr) {
    std::cerr << "kreg: unknown --backend '" << backend << "' (cpu, cuda)\n";
    return kExitUsage;
  }
  auto handle = o->registry->resolve(a.op, kreg::Target{DLDevice{be->device_type(), 0}, *d},
                                     kreg::ResolveOptions{backend});
  if (!handle) {
    std::cerr << "kreg: " << handle.status().message() << "\n";
    return kExitViolation;
  }
  *h = *handle;
  // Every dimension of the op has a size and every size names a dimension of the op.
  if (kreg::Status st = kreg::harness::check_shape_names(h->spec(), *symbols); !st.ok()) {
    std::cerr << "kreg: " << st.message() << "\n";
    return kExitUsage;
  }
  // Sizes overflow-checked and compared with free memory before anything is allocated.
  if (kreg::Status st = kreg::harness::check_example_fits(
          h->spec(), *symbols, *d, DLDevice{be->device_type(), 0}, !a.bench);
      !st.ok()) {
    std::cerr << "kreg: " << st.message() << "\n";
    return kExitUsage;
  }
  std::vector<kreg::NamedAttr> named;
  for (const std::string& kv : a.attrs) {
    const size_t eq = kv.find('=');
    if (eq == std::string::npos) {
      std::cerr << "kreg: --attr '" << kreg::excerpt(kv, 60) << "' is not NAME=VALUE\n";
      return kExitUsage;
    }
    const std::string name = kv.substr(0, eq), value = kv.substr(eq + 1);
    for (const kreg::NamedAttr& earlier : named) {
      if (earlier.name == name) {
        std::cerr << "kreg: --attr " << kreg::excerpt(name, 60) << " is given twice\n";
        return kExitUsage;
      }
    }
    const kreg::Param* p = h->spec().signature.find(name);
    kreg::NamedAttr na{name, value};
    const std::string what = "--attr " + kreg::excerpt(name, 60);
    kreg::Status bad;
    if (p && p->kind == kreg::ArgKind::kFloat) {
      auto v = kreg::parse_float(value, what);
      if (v) na.value = *v; else bad = v.status();
    } else if (p && p->kind == kreg::ArgKind::kInt) {
      auto v = kreg::parse_int(value, what);
      if (v) na.value = *v; else bad = v.status();
    } else if (p && p->kind == kreg::ArgKind::kBool) {
      auto v = kreg::parse_bool(value, what);
      if (v) na.value = *v; else bad = v.status();
    }
    if (!bad.ok()) {
      std::cerr << "kreg: " << bad.message() << " (attribute of " << h->op() << ")\n";
      return kExitUsage;
    }
    named.push_back(std::move(na));
  }
  auto list = h->attrs(named);
  if (!list) {
    std::cerr << "kreg: " << list.status().message() << "\n";
    return kExitUsage;
  }
  *attrs = std::move(list).value();
  return 0;
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
  if (!result) {
    std::cerr << "kreg: " << result.status().message() << "\n";
    return kExitViolation;
  }
  bool ok = true;
  std::printf("%s [%s] %s %s, seed %llu, vs cpu reference\n", h.op().c_str(), h.backend().c_str(),
              a.shape.c_str(), std::string(kreg::dtype_name(dtype)).c_str(),
              static_cast<unsigned long long>(a.seed));
  for (const auto& c : *result) {
    ok = ok && c.ok();
    std::printf("  %-10s max_abs_err %.3g  max_rel_err %.3g  mismatches %zu/%zu  %s\n",
                c.tensor.c_str(), c.max_abs, c.max_rel, c.mismatches, c.count,
                c.ok() ? "OK" : "MISMATCH");
  }
  return ok ? 0 : kExitViolation;
}

int cmd_bench(const std::string& manifest, const RunArgs& a) {
  if (!kreg::harness::gpu_available()) {
    std::cerr << "kreg bench: no CUDA device here (bench times GPU kernels with CUDA events)\n";
    return kExitViolation;
  }
  RunArgs ra = a;
  ra.bench = true;
  if (ra.backend.empty()) ra.backend = "cuda";
  Opened o;
  kreg::KernelHandle h;
  kreg::harness::SymbolMap symbols;
  kreg::DType dtype;
  kreg::AttrList attrs;
  if (int rc = prepare(manifest, ra, &o, &h, &symbols, &dtype, &attrs)) return rc;
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
  if (!check) {
    std::cerr << "kreg: " << check.status().message() << "\n";
    return kExitViolation;
  }
  for (const auto& c : *check) {
    if (!c.ok()) {
      std::cerr << "kreg bench: " << h.op() << " disagrees with the CPU reference on '" << c.tensor
                << "' (" << c.mismatches << " mismatches); not timing a wrong kernel\n";
      return kExitViolation;
    }
  }
  std::string checked = "checked vs cpu reference";
  for (const auto& [name, v] : check_symbols) checked += " " + name + "=" + std::to_string(v);
  auto copy = kreg::harness::copy_bandwidth_gbps(size_t{1} << 30);
  if (!copy) {
    std::cerr << "kreg: " << copy.status().message() << "\n";
    return kExitViolation;
  }
  auto t = kreg::harness::time_on_gpu(h, symbols, dtype, attrs, a.reps, a.seed);
  if (!t) {
    std::cerr << "kreg: " << t.status().message() << "\n";
    return kExitViolation;
  }
  std::printf("%s [%s] %s %s on %s\n", h.op().c_str(), h.backend().c_str(), a.shape.c_str(),
              std::string(kreg::dtype_name(dtype)).c_str(), kreg::harness::gpu_name().c_str());
  std::printf(
      "  median %.2f us (min %.2f), %zu bytes, %.0f GB/s = %.1f%% of copy %.0f GB/s "
      "[%d buffer sets%s, %d reps]\n",
      t->median_us, t->min_us, t->bytes, t->gbps, 100.0 * t->gbps / *copy, *copy, t->buffer_sets,
      t->graph ? ", CUDA graph" : "", a.reps);
  std::printf("  %s: OK\n", checked.c_str());
  return 0;
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
      ->check(CLI::PositiveNumber);
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
  bench->add_option("--reps", ra.reps_text,
                    "timed repetitions (median reported), in [1, 1000000]");

  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    app.exit(e);
    return kExitUsage;
  }
  if (*list) return cmd_list(manifest, group, json);
  if (*info) return cmd_info(manifest, op, json);
  if (*validate) return cmd_validate(manifest, va);
  if (*run || *bench) {
    if (int rc = parse_run_numbers(&ra)) return rc;
  }
  if (*run) return cmd_run(manifest, ra);
  if (*bench) return cmd_bench(manifest, ra);
  return kExitUsage;
}
