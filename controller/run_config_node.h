// Typed reading of one YAML value into one job-config field (run_config_internal.h's FieldPtr).
//
// Why: file values and command-line override values go through the same conversion, so that
// `trainer.lr: fast` and `trainer.lr=fast` fail alike. Kept apart from run_config_internal.h so
// that only the parser sees yaml-cpp.
#pragma once

#include <yaml-cpp/depthguard.h>
#include <yaml-cpp/yaml.h>

#include <string>
#include <string_view>

#include "controller/run_config_internal.h"
#include "miles/status.h"

namespace miles::run_config_internal {

// Sets *ptr from `node`; strings expand ${VAR}. The error says what was expected and what came
// ("expected a number, got \"fast\""); the caller prefixes the place and the key.
Status assign_field(const FieldPtr& ptr, const YAML::Node& node);

// A YAML value as messages show it: "\"fast\"", "a list", "a map", "nothing".
std::string describe(const YAML::Node& node);

}  // namespace miles::run_config_internal
