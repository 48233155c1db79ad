// The tools' output as a terminal receives it, and their exit codes. Hostile plugins
// (tests/fixtures/plugins/hostile.cpp), manifests and command lines try to forge lines and
// drive the terminal; every subcommand's human output must stay plain printable text, its
// JSON valid, and every kind of usage error must exit 2 in every subcommand.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <sstream>
#include <string>
#include <vector>

#include "test_support.hpp"

namespace fs = std::filesystem;

namespace {

using kreg::test::read_file;
using kreg::test::Scratch;

struct Outcome {
  int exit_code = -1;
  std::string out, err;
  std::string all() const { return out + err; }
};

// Runs `argv` without a shell (so arguments can hold any byte), in the source tree, with
// KREG_PLUGIN_DIR set to `plugin_dir` (unset when empty); stdout and stderr apart.
Outcome run(const std::vector<std::string>& argv, const std::string& plugin_dir = "") {
  Scratch s;
  const fs::path out = s.root() / "out", err = s.root() / "err";
  const pid_t pid = ::fork();
  if (pid == 0) {
    if (::chdir(KREG_SOURCE_DIR) != 0) ::_exit(126);
    const int o = ::open(out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    const int e = ::open(err.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    const int in = ::open("/dev/null", O_RDONLY);
    if (o < 0 || e < 0 || in < 0) ::_exit(126);
    ::dup2(o, 1);
    ::dup2(e, 2);
    ::dup2(in, 0);
    ::unsetenv("KREG_FORCE_BACKEND");
    ::unsetenv("KREG_MANIFEST");
    if (plugin_dir.empty()) {
      ::unsetenv("KREG_PLUGIN_DIR");
    } else {
      ::setenv("KREG_PLUGIN_DIR", plugin_dir.c_str(), 1);
    }
    std::vector<char*> args;
    for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    ::execv(args[0], args.data());
    ::_exit(127);
  }
  Outcome r;
  int status = 0;
  if (pid < 0 || ::waitpid(pid, &status, 0) != pid) return r;
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  r.out = read_file(out);
  r.err = read_file(err);
  return r;
}

const std::string kCli = KREG_CLI;
const std::string kHost = KREG_HOST;

Outcome kreg(std::vector<std::string> args, const std::string& plugin_dir = "") {
  args.insert(args.begin(), kCli);
  return run(args, plugin_dir);
}

// Human output: printable ASCII and newlines only (kreg's own text is ASCII and every
// string from outside is escaped), and no line that passes for a violation it did not
// print.
void expect_plain(const std::string& text, const std::string& what) {
  for (size_t i = 0; i < text.size(); ++i) {
    const auto b = static_cast<unsigned char>(text[i]);
    if (b == '\n') continue;
    if (b < 0x20 || b >= 0x7f) {
      ADD_FAILURE() << what << ": raw byte 0x" << std::hex << static_cast<int>(b) << " at "
                    << std::dec << i << " in:\n"
                    << text;
      return;
    }
  }
  std::istringstream lines(text);
  for (std::string line; std::getline(lines, line);) {
    const size_t start = line.find_first_not_of(' ');
    EXPECT_FALSE(start != std::string::npos && line.compare(start, 14, "error [forged]") == 0)
        << what << ": forged line '" << line << "' in:\n"
        << text;
  }
}

// The hostile text as kreg's escaping shows it.
constexpr const char* kShown = "first\\n error [forged] \\x1b[31mred\\x1b[0m\\rover \\x1b]0;title";

std::string manifest(const std::string& plugin_dir, const std::string& groups,
                     const std::string& rest = "") {
  return "kreg_manifest: 1\nplugin_dir: " + plugin_dir + "\ngroups:\n" + groups + rest;
}

std::string group(const std::string& name, const std::string& library) {
  return "  - name: " + name + "\n    library: " + library + "\n";
}

TEST(CliOutput, HostileFreeTextIsEscapedEverywhere) {
  Scratch s;
  const std::string m = s.write("hostile.yaml", manifest(KREG_TEST_PLUGIN_DIR,
                                                         group("hostile", "libkreg_hostile.so")))
                            .string();
  Outcome list = kreg({"list", "--manifest", m});
  EXPECT_EQ(list.exit_code, 0) << list.all();
  EXPECT_NE(list.out.find("hostile.echo"), std::string::npos) << list.all();
  expect_plain(list.all(), "list");

  Outcome info = kreg({"info", "hostile.echo", "--manifest", m});
  EXPECT_EQ(info.exit_code, 0) << info.all();
  EXPECT_NE(info.out.find(kShown), std::string::npos) << info.out;
  EXPECT_NE(info.out.find("\\xc2\\x9b2J \\x9b31m \\xff\\xfe \\xe2\\x80\\xaedesrever \\x7f end"),
            std::string::npos)
      << info.out;
  expect_plain(info.all(), "info");

  // JSON: valid escapes, no raw control byte, no invalid UTF-8 (replaced).
  Outcome json = kreg({"info", "hostile.echo", "--json", "--manifest", m});
  EXPECT_EQ(json.exit_code, 0) << json.all();
  EXPECT_NE(
      json.out.find("\"description\":\"first\\n error [forged] \\u001b[31mred\\u001b[0m\\rover "
                    "\\u001b]0;title\\u0007 \\u009b2J \\ufffd31m \\ufffd\\ufffd \\u202edesrever "
                    "\\u007f end\""),
      std::string::npos)
      << json.out;
  expect_plain(json.out, "info --json");

  // The kernel's message is a failed run (1), escaped.
  Outcome r = kreg({"run", "hostile.echo", "--shape", "N=4", "--dtype", "f32", "--backend", "cpu",
                    "--manifest", m});
  EXPECT_EQ(r.exit_code, 1) << r.all();
  EXPECT_NE(r.err.find(std::string("hostile.echo (cpu): ") + kShown), std::string::npos) << r.err;
  expect_plain(r.all(), "run");

  Outcome v = kreg({"validate", "--manifest", m});
  expect_plain(v.all(), "validate");
  Outcome vj = kreg({"validate", "--json", "--manifest", m});
  expect_plain(vj.out, "validate --json");
}

TEST(CliOutput, RefusedHostileNamesPrintEscaped) {
  Scratch s;
  const std::string m =
      s.write("names.yaml",
              manifest(KREG_TEST_PLUGIN_DIR, group("hostile", "libkreg_hostile_names.so")))
          .string();
  for (const std::vector<std::string>& args :
       {std::vector<std::string>{"list", "--manifest", m},
        std::vector<std::string>{"info", "hostile.echo", "--manifest", m},
        std::vector<std::string>{"run", "hostile.echo", "--shape", "N=4", "--manifest", m}}) {
    Outcome r = kreg(args);
    EXPECT_EQ(r.exit_code, 1) << args[0] << ": a group that does not load\n" << r.all();
    EXPECT_NE(r.err.find("hostile"), std::string::npos) << r.all();
    expect_plain(r.all(), args[0]);
  }
  Outcome v = kreg({"validate", "--manifest", m});
  EXPECT_EQ(v.exit_code, 1) << v.all();
  EXPECT_NE(v.out.find("error [schema] hostile"), std::string::npos) << v.out;
  expect_plain(v.all(), "validate");
  Outcome vj = kreg({"validate", "--json", "--manifest", m});
  EXPECT_EQ(vj.exit_code, 1) << vj.all();
  expect_plain(vj.out, "validate --json");

  Outcome host = run({kHost, "--manifest", m, "--device", "cpu"});
  EXPECT_EQ(host.exit_code, 1) << host.all();
  expect_plain(host.all(), "kreg-host");
}

TEST(CliOutput, CommandLineTextIsEscaped) {
  const std::string nasty = "layernorm.x\n error [forged]\x1b[31m\r\xc2\x9b\xff";
  for (const std::vector<std::string>& args :
       {std::vector<std::string>{"info", nasty}, std::vector<std::string>{"info", nasty, "--json"},
        std::vector<std::string>{"run", nasty, "--shape", "T=1", "--backend", "cpu"},
        std::vector<std::string>{"bench", nasty, "--shape", "T=1"},
        std::vector<std::string>{"bench", "layernorm.rmsnorm", "--shape", "T=1,H=8", "--after",
                                 nasty, "--after-shape", "T=1"},
        std::vector<std::string>{"bench", "layernorm.rmsnorm", "--shape", "T=1,H=8", "--after",
                                 "layernorm.rmsnorm", "--after-shape", nasty},
        std::vector<std::string>{"list", "--group", nasty},
        std::vector<std::string>{"run", "layernorm.rmsnorm", "--shape", "T=1,H=8", "--backend",
                                 "cpu", "--attr", nasty + "=1"},
        std::vector<std::string>{"run", "layernorm.rmsnorm", "--shape", "T=1,H=8", "--backend",
                                 nasty},
        std::vector<std::string>{"run", "layernorm.rmsnorm", "--shape", "T=1,H=8", "--dtype",
                                 nasty},
        std::vector<std::string>{"run", "layernorm.rmsnorm", "--shape", nasty},
        std::vector<std::string>{nasty}, std::vector<std::string>{"list", nasty},
        std::vector<std::string>{"validate", "--plugins-src", nasty},
        std::vector<std::string>{"validate", "--expect-groups", nasty},
        std::vector<std::string>{"list", "--manifest", nasty}}) {
    Outcome r = kreg(args, KREG_PLUGIN_DIR);
    EXPECT_EQ(r.exit_code, 2) << args[0] << "\n" << r.all();
    expect_plain(r.all(), args[0] + " " + (args.size() > 1 ? args[1] : ""));
  }
}

TEST(CliOutput, HostileManifestStringsAreEscaped) {
  Scratch s;
  // An alias message with an escape sequence and a forged line, and a NUL in a name.
  const std::string m =
      s.write("aliases.yaml",
              manifest(KREG_PLUGIN_DIR, group("activation", "libkreg_activation.so"),
                       "aliases:\n  - from: activation.old\n    to: activation.silu_and_mul\n"
                       "    message: \"renamed\\n error [forged] \\e[31m\\r\"\n"))
          .string();
  for (const std::vector<std::string>& args :
       {std::vector<std::string>{"list", "--manifest", m},
        std::vector<std::string>{"info", "activation.old", "--manifest", m},
        std::vector<std::string>{"run", "activation.old", "--shape", "T=1,D=4", "--backend", "cpu",
                                 "--manifest", m},
        std::vector<std::string>{"validate", "--manifest", m}}) {
    Outcome r = kreg(args);
    expect_plain(r.all(), args[0]);
  }
  const std::string nul = s.write("nul.yaml", manifest(KREG_PLUGIN_DIR,
                                                       "  - name: \"activ\\0ation\"\n"
                                                       "    library: libkreg_activation.so\n"))
                              .string();
  Outcome r = kreg({"list", "--manifest", nul});
  EXPECT_EQ(r.exit_code, 2) << r.all();
  expect_plain(r.all(), "list (NUL in the manifest)");
  Outcome v = kreg({"validate", "--manifest", nul});
  EXPECT_EQ(v.exit_code, 1) << v.all();
  expect_plain(v.all(), "validate (NUL in the manifest)");
}

TEST(CliOutput, InfoShowsAnAliasChain) {
  Scratch s;
  const std::string m =
      s.write(
           "chain.yaml",
           manifest(KREG_PLUGIN_DIR, group("activation", "libkreg_activation.so"),
                    "aliases:\n"
                    "  - {from: activation.v1, to: activation.v2, message: \"use silu_and_mul\"}\n"
                    "  - {from: activation.v2, to: activation.v3}\n"
                    "  - {from: activation.v3, to: activation.silu_and_mul}\n"
                    "  - {from: activation.dangling, to: activation.gone}\n"))
          .string();
  Outcome r = kreg({"info", "activation.v1", "--manifest", m});
  ASSERT_EQ(r.exit_code, 0) << r.all();
  EXPECT_EQ(
      r.out.rfind("activation.silu_and_mul  (you asked for the deprecated alias activation.v1, "
                  "which leads here through activation.v1 -> activation.v2 -> activation.v3 "
                  "-> activation.silu_and_mul: use silu_and_mul)\n",
                  0),
      0u)
      << r.out;
  EXPECT_NE(r.out.find("silu_and_mul(Tensor[T,2*D] x, Tensor(a!)[T,D] out) -> ()"),
            std::string::npos);
  Outcome j = kreg({"info", "activation.v2", "--json", "--manifest", m});
  ASSERT_EQ(j.exit_code, 0) << j.all();
  EXPECT_NE(
      j.out.find("\"op\":\"activation.silu_and_mul\",\"alias_of\":\"activation.silu_and_mul\","
                 "\"deprecation\":\"\",\"alias_chain\":[\"activation.v2\",\"activation.v3\","
                 "\"activation.silu_and_mul\"]"),
      std::string::npos)
      << j.out;
  Outcome run =
      kreg({"run", "activation.v1", "--shape", "T=2,D=8", "--dtype", "f32", "--manifest", m});
  EXPECT_EQ(run.exit_code, 0) << run.all();
  // The run is reported under the op the chain ends at (on whichever backend this machine
  // selects: cuda where there is a GPU).
  EXPECT_NE(run.out.find("activation.silu_and_mul ["), std::string::npos) << run.all();
  EXPECT_NE(run.err.find("'activation.v1' is a deprecated alias of 'activation.silu_and_mul' (via "
                         "activation.v2 -> activation.v3): use silu_and_mul"),
            std::string::npos)
      << run.err;
  Outcome dangling = kreg({"info", "activation.dangling", "--manifest", m});
  EXPECT_EQ(dangling.exit_code, 2) << dangling.all();
  EXPECT_NE(dangling.err.find("unknown op 'activation.dangling' (an alias: activation.dangling -> "
                              "activation.gone, and no group registers activation.gone)"),
            std::string::npos)
      << dangling.err;
}

// One rule for every subcommand: a usage error exits 2.
TEST(CliOutput, EveryUsageErrorExitsTwo) {
  const std::string bad_manifest = KREG_TEST_FIXTURES "/manifests/bad/duplicate_group.yaml";
  const std::vector<std::vector<std::string>> cases = {
      {},
      {"frobnicate"},
      {"--bogus", "list"},
      // list
      {"list", "--group", "nosuch"},
      {"list", "--bogus"},
      {"list", "extra"},
      {"list", "--manifest", "/nonexistent/registry.yaml"},
      {"list", "--manifest", bad_manifest},
      {"list", "--manifest", KREG_SOURCE_DIR},
      // info
      {"info"},
      {"info", "layernorm.nosuch"},
      {"info", "nodot"},
      {"info", "Layernorm.RMSNORM"},
      {"info", ""},
      {"info", "layernorm.rmsnorm", "--bogus"},
      {"info", "layernorm.rmsnorm", "--manifest", "/nonexistent/registry.yaml"},
      {"info", "layernorm.rmsnorm", "--manifest", bad_manifest},
      // validate
      {"validate", "--bogus"},
      {"validate", "--timeout", "-1"},
      {"validate", "--timeout", "abc"},
      {"validate", "--timeout", "nan"},
      {"validate", "--timeout", "inf"},
      {"validate", "--timeout"},
      {"validate", "--expect-groups", "/nonexistent/groups.txt"},
      {"validate", "--plugins-src", "/nonexistent/plugins"},
      {"validate", "--manifest", "/nonexistent/registry.yaml"},
      {"validate", "extra"},
  };
  // run and bench share their arguments and their errors.
  const std::vector<std::vector<std::string>> run_cases = {
      {"layernorm.nosuch", "--shape", "T=3,H=8"},
      {"nodot", "--shape", "T=3,H=8"},
      {"layernorm.rmsnorm"},
      {"--shape", "T=3,H=8"},
      {"layernorm.rmsnorm", "--shape", "T=3"},
      {"layernorm.rmsnorm", "--shape", "T=3,H=8,X=2"},
      {"layernorm.rmsnorm", "--shape", "T=x,H=8"},
      {"layernorm.rmsnorm", "--shape", "T"},
      {"layernorm.rmsnorm", "--shape", ""},
      {"layernorm.rmsnorm", "--shape", "T=3,H=8", "--attr", "epsilon=1"},
      {"layernorm.rmsnorm", "--shape", "T=3,H=8", "--attr", "eps"},
      {"layernorm.rmsnorm", "--shape", "T=3,H=8", "--dtype", "f99"},
      {"layernorm.rmsnorm", "--shape", "T=3,H=8", "--dtype", "i32"},
      {"layernorm.rmsnorm", "--shape", "T=3,H=8", "--backend", "tpu"},
      {"layernorm.rmsnorm", "--shape", "T=3,H=8", "--bogus"},
      {"layernorm.rmsnorm", "--shape", "T=3,H=8", "--manifest", "/nonexistent/registry.yaml"},
      {"layernorm.rmsnorm", "--shape", "T=3,H=8", "--manifest", bad_manifest},
  };
  std::vector<std::vector<std::string>> all = cases;
  for (const char* sub : {"run", "bench"}) {
    for (auto c : run_cases) {
      c.insert(c.begin(), sub);
      if (std::string(sub) == "run" && std::find(c.begin(), c.end(), "--backend") == c.end()) {
        c.insert(c.end(), {"--backend", "cpu"});
      }
      all.push_back(c);
    }
  }
  all.push_back({"bench", "layernorm.rmsnorm", "--shape", "T=3,H=8", "--backend", "cpu"});
  for (const auto& args : all) {
    Outcome r = kreg(args, KREG_PLUGIN_DIR);
    std::string cmd = "kreg";
    for (const auto& a : args) cmd += " '" + a + "'";
    EXPECT_EQ(r.exit_code, 2) << cmd << "\n" << r.all();
    EXPECT_FALSE(r.all().empty()) << cmd << ": a usage error says what is wrong";
    expect_plain(r.all(), cmd);
  }
}

// kreg-host's shapes and thread count: a value outside its range, or a step whose tensors
// or CPU reference matmul would be too large (once a std::bad_alloc abort, or hours in the
// reference loop), is a usage error naming the problem, exit 2, before any work.
TEST(CliOutput, HostRefusesStepsItCannotRun) {
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{"--tokens", "0"}, "--tokens"},
      {{"--tokens", "-5"}, "--tokens"},
      {{"--tokens", "99999999999999999999"}, "--tokens"},
      {{"--hidden", "3037000500", "--intermediate", "3037000500"}, "--hidden"},
      {{"--tokens", "100000", "--hidden", "100000"}, "more than 2^28 elements"},
      {{"--tokens", "16", "--hidden", "65536", "--intermediate", "4096"}, "2^28 elements"},
      {{"--tokens", "4096", "--hidden", "4096", "--intermediate", "16384"}, "2^33 multiply-adds"},
      {{"--stress", "100000"}, "--stress"},
      {{"--stress", "-1"}, "--stress"},
  };
  for (const auto& [args, words] : cases) {
    std::vector<std::string> argv{kHost, "--manifest", KREG_SOURCE_DIR "/registry.yaml"};
    argv.insert(argv.end(), args.begin(), args.end());
    Outcome r = run(argv, KREG_PLUGIN_DIR);
    std::string cmd;
    for (const auto& a : argv) cmd += " '" + a + "'";
    EXPECT_EQ(r.exit_code, 2) << cmd << "\n" << r.all();
    EXPECT_NE(r.err.find(words), std::string::npos) << cmd << "\n" << r.all();
    EXPECT_EQ(r.out, "") << cmd << ": nothing runs";
    expect_plain(r.all(), cmd);
  }
}

// Every float option of every tool refuses NaN and infinities (CLI11's own range checks let
// NaN through: a "--timeout nan" once killed kreg-tp-demo's ranks at once, a "--zipf nan"
// hung lplb_demo) and values past its range, naming the option: a usage error, exit 2.
TEST(CliOutput, FloatOptionsRefuseNonFiniteValues) {
  struct Tool {
    std::string path;
    std::vector<std::string> before;  // a subcommand and required arguments
    std::string option;
  };
  const std::vector<Tool> tools = {
      {KREG_CLI, {"validate"}, "--timeout"},
      {KREG_HOST, {}, "--duration"},
      {KREG_HOST, {}, "--precheck-timeout"},
      {KREG_STORE_CLI, {"get", "key", "--store", "file:///nonexistent"}, "--timeout"},
      {KREG_STORE_CLI, {"set", "key", "v", "--store", "file:///nonexistent"}, "--timeout"},
      {KREG_TP_DEMO, {"--cpu", "--ranks", "1"}, "--timeout"},
      {KREG_LPLB_DEMO, {}, "--zipf"},
  };
  for (const Tool& t : tools) {
    for (const char* value : {"nan", "inf", "-inf", "1e400", "-5", "3x"}) {
      std::vector<std::string> args{t.path};
      args.insert(args.end(), t.before.begin(), t.before.end());
      args.insert(args.end(), {t.option, value});
      Outcome r = run(args, KREG_PLUGIN_DIR);
      std::string cmd;
      for (const auto& a : args) cmd += " '" + a + "'";
      EXPECT_EQ(r.exit_code, 2) << cmd << "\n" << r.all();
      EXPECT_NE(r.err.find(t.option), std::string::npos) << cmd << "\n" << r.all();
      expect_plain(r.all(), cmd);
    }
  }
}

TEST(CliOutput, FailuresExitOne) {
  Scratch s;
  // A validate violation, a kernel error, a group that does not load.
  const std::string m = s.write("hostile.yaml", manifest(KREG_TEST_PLUGIN_DIR,
                                                         group("hostile", "libkreg_hostile.so")))
                            .string();
  EXPECT_EQ(kreg({"run", "hostile.echo", "--shape", "N=2", "--dtype", "f32", "--backend", "cpu",
                  "--manifest", m})
                .exit_code,
            1);
  const std::string broken =
      s.write("broken.yaml",
              manifest(KREG_TEST_PLUGIN_DIR, group("hostile", "libkreg_wrong_group.so")))
          .string();
  EXPECT_EQ(kreg({"list", "--manifest", broken}).exit_code, 1);
  EXPECT_EQ(kreg({"validate", "--manifest", broken}).exit_code, 1);
  // Validate reports a manifest's own errors as violations; one it cannot read is a usage error.
  EXPECT_EQ(
      kreg({"validate", "--manifest", KREG_TEST_FIXTURES "/manifests/bad/duplicate_group.yaml"},
           KREG_PLUGIN_DIR)
          .exit_code,
      1);
  EXPECT_EQ(kreg({"list"}, KREG_PLUGIN_DIR).exit_code, 0);
  EXPECT_EQ(kreg({"--help"}).exit_code, 0);
}

// A huge value on the command line is echoed as a short excerpt (escaped and cut, with its
// length), never in full: one line of kreg's own text, not 130 KB of the user's.
TEST(CliOutput, LongCommandLineValuesAreShortened) {
  const std::string L(130000, 'A'), X(60000, 'X');
  const std::string base = "T=2,H=4";
  const std::vector<std::vector<std::string>> cases = {
      {"run", "layernorm.rmsnorm", "--shape", base, "--dtype", L},
      {"run", "layernorm.rmsnorm", "--shape", base, "--backend", L},
      {"bench", "layernorm.rmsnorm", "--shape", base, "--backend", L},
      {"info", L},
      {"info", "layernorm." + L},
      {"list", "--group", L},
      {"run", "layernorm.rmsnorm", "--shape", base + "," + L + "=1", "--backend", "cpu"},
      {"run", "layernorm.rmsnorm", "--shape", X + "=1," + X + "=2", "--backend", "cpu"},
      {"run", "layernorm.rmsnorm", "--shape", base + "," + X + "=x", "--backend", "cpu"},
      {"run", "layernorm.rmsnorm", "--shape", base, "--backend", "cpu", "--attr", X + "=1",
       "--attr", X + "=2"},
      {"run", "layernorm.rmsnorm", "--shape", base, "--backend", "cpu", "--attr", L},
      {"list", "--manifest", "/tmp/" + L},
      {"validate", "--manifest", "/tmp/" + L},
      {"jit", "build", "--op", L, "--arch", "sm_90a", "--shape", "H=8"},
      {"jit", "build", "--op", "layernorm.rmsnorm", "--arch", "sm_90a", "--shape", "H=8", "--dtype",
       L},
  };
  for (const auto& args : cases) {
    Outcome r = kreg(args, KREG_PLUGIN_DIR);
    std::string cmd = "kreg";
    for (const auto& a : args) cmd += " '" + a.substr(0, 40) + (a.size() > 40 ? "...'" : "'");
    EXPECT_EQ(r.exit_code, 2) << cmd << "\n" << r.all().substr(0, 2000);
    EXPECT_LT(r.all().size(), 1000u) << cmd << "\n" << r.all().substr(0, 2000);
    EXPECT_NE(r.all().find(" bytes)"), std::string::npos) << cmd << "\n" << r.all().substr(0, 2000);
    expect_plain(r.all(), cmd);
  }
}

// kreg-host checks its --dtype with the other arguments, before loading any group, and a
// manifest it cannot use is a usage error (2), as for kreg.
TEST(CliOutput, HostUsageErrorsExitTwoBeforeLoading) {
  Scratch s;
  const fs::path fifo = s.root() / "fifo.yaml";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  const std::string manifest_arg = KREG_SOURCE_DIR "/registry.yaml";
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{"--device", "cpu", "--dtype", "bogus", "--manifest", manifest_arg}, "--dtype 'bogus'"},
      {{"--device", "cpu", "--dtype", std::string(100000, 'D'), "--manifest", manifest_arg},
       "bytes)"},
      {{"--device", "cpu", "--manifest", fifo.string()}, "FIFO"},
      {{"--device", "cpu", "--manifest", "/nonexistent/registry.yaml"}, "cannot read"},
      {{"--device", "cpu", "--manifest", KREG_TEST_FIXTURES "/manifests/bad/duplicate_group.yaml"},
       "duplicate"},
  };
  for (const auto& [args, words] : cases) {
    std::vector<std::string> argv{kHost};
    argv.insert(argv.end(), args.begin(), args.end());
    Outcome r = run(argv, KREG_PLUGIN_DIR);
    std::string cmd;
    for (const auto& a : argv) cmd += " '" + a.substr(0, 60) + "'";
    EXPECT_EQ(r.exit_code, 2) << cmd << "\n" << r.all().substr(0, 2000);
    EXPECT_NE(r.err.find(words), std::string::npos) << cmd << "\n" << r.all().substr(0, 2000);
    EXPECT_EQ(r.out, "") << cmd << ": nothing is loaded";
    EXPECT_LT(r.all().size(), 1500u) << cmd;
    expect_plain(r.all(), cmd);
  }
}

// kreg jit build refuses what it cannot build before compiling anything: an --arch NVRTC
// does not compile for (said once, not once per dtype), and specialization values a kernel's
// int template argument cannot take (0, past int32): usage errors, exit 2.
TEST(CliOutput, JitBuildRefusesBadArchAndOutOfRangeValues) {
  Scratch s;
  const std::string cache = (s.root() / "jit-cache").string();
  auto jit = [&](std::vector<std::string> args) {
    args.insert(args.begin(), {kCli, "jit", "build", "--op", "layernorm.rmsnorm"});
    ::setenv("KREG_JIT_CACHE", cache.c_str(), 1);
    Outcome r = run(args, KREG_PLUGIN_DIR);
    ::unsetenv("KREG_JIT_CACHE");
    return r;
  };
  for (const char* h : {"H=0", "H=2147483648", "H=9223372036854775807"}) {
    Outcome r = jit({"--arch", "sm_90a", "--shape", h, "--dtype", "f32"});
    if (r.err.find("has no jit implementation") != std::string::npos) {
      GTEST_SKIP() << "this build has no jit implementation (plugins built without CUDA): "
                   << r.err;
    }
    EXPECT_EQ(r.exit_code, 2) << h << "\n" << r.all();
    EXPECT_NE(r.err.find("out of range for a specialization: it must be 1 to 2147483647"),
              std::string::npos)
        << h << "\n"
        << r.all();
    EXPECT_EQ(r.err.find("NVRTC"), std::string::npos) << h << ": nothing compiled\n" << r.all();
    expect_plain(r.all(), h);
  }
  // Refused by its form (sm_0), or by NVRTC's own list of what it compiles for (sm_10):
  // each said once, though the op has three dtypes to build.
  for (const auto& [arch, said] : std::vector<std::pair<std::string, std::string>>{
           {"sm_0", "architecture 'sm_0' is not of the form sm_90 or sm_90a"},
           {"compute_90", "architecture 'compute_90' is not of the form sm_90 or sm_90a"},
           {"sm_10", "architecture 'sm_10' is not one NVRTC"}}) {
    Outcome r = jit({"--arch", arch, "--shape", "H=8"});
    if (r.err.find("NVRTC not found") != std::string::npos) {
      GTEST_SKIP() << "no NVRTC here: " << r.err;
    }
    EXPECT_EQ(r.exit_code, 2) << arch << "\n" << r.all();
    const size_t first = r.err.find(said);
    EXPECT_NE(first, std::string::npos) << arch << "\n" << r.all();
    EXPECT_EQ(r.err.find(said, first + 1), std::string::npos) << arch << ": said more than once:\n"
                                                              << r.all();
    EXPECT_EQ(r.out, "") << arch << "\n" << r.all();
    expect_plain(r.all(), arch);
  }
}

}  // namespace
