// libFuzzer target: arbitrary bytes as the YAML job file of `miles run` (parse_run_config), and
// when it parses, the cross-field checks (validate_run_config) and the round trip a run relies on:
// run_config_to_yaml, written to RUN_DIR/config.yaml, must read back to an equal config; each
// reward entry through RewardSpec::validate, as the controller checks it at start (its regex
// pattern compiled, its url parsed). Bad input must come back as an error value: no crash, no UB,
// no leak, no exception out of yaml-cpp.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "miles/controller/run_config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string yaml(reinterpret_cast<const char*>(data), size);
  auto config = miles::parse_run_config(yaml, "fuzz.yaml", {});
  if (!config.ok()) return 0;
  if (!miles::validate_run_config(*config).ok()) std::abort();  // parse_run_config validated it
  for (const miles::RewardSpec& reward : config->rewards) {
    const miles::Status valid = reward.validate();
    if (!valid.ok() && valid.message().empty()) std::abort();
  }
  const std::string written = miles::run_config_to_yaml(*config);
  auto again = miles::parse_run_config(written, "fuzz.yaml", {});  // same name: same header
  if (!again.ok() || miles::run_config_to_yaml(*again) != written) {
    std::fprintf(stderr, "config.yaml does not read back: %s\n%s\n", again.message().c_str(),
                 written.c_str());
    std::abort();
  }
  return 0;
}
