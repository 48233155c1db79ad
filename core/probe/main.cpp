// kreg-probe: the fresh process in which probe_plugin (kreg/plugin_probe.hpp) loads one
// plugin (and, for validate's jit-sources rule, compiles its jit sources). Started by
// probe_plugin only; its command line and report are described there.
#include "kreg/plugin_probe.hpp"

int main(int argc, char** argv) { return kreg::probe_child_main(argc, argv); }
