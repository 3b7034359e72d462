// The job config's schema, shared by the parser, the validator and the YAML writer.
//
// Why: one table names every key of every section with its type and the struct field it fills, so
// that parsing, overrides, unknown-key hints and run_config_to_yaml cannot disagree about which
// keys exist. The table holds pointers into one RunConfig (or one RewardSpec): build it for the
// object you read or write.
#pragma once

#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "miles/controller/reward.h"
#include "miles/controller/run_config.h"
#include "miles/status.h"

namespace miles::run_config_internal {

// The scalar types first (type_name indexes them); then every ConfigEnum of run_config.h and
// reward.h.
using FieldPtr =
    std::variant<std::string*, int64_t*, uint64_t*, double*, bool*, std::vector<std::string>*,
                 std::vector<int64_t>*, Device*, Environment*, LrDecay*, TrainerComm*, Advantage*,
                 PolicyLoss*, KlEstimatorKind*, Reduction*, Correction*, OldLogp*, Transport*,
                 WeightComm*, Encoding*, Compression*, AsyncMode*, StalePolicy*, SyncPause*,
                 Progress*, RewardKind*>;

struct Field {
  std::string_view key;
  FieldPtr ptr;
};

struct Section {
  std::string_view name;
  std::vector<Field> fields;
};

// The sections of a job file in file order; "rewards" (a list, see reward_fields) is among the
// names but not in sections_of.
std::span<const std::string_view> section_names();
std::vector<Section> sections_of(RunConfig& config);  // every section but rewards
std::vector<Field> reward_fields(RewardSpec& spec);   // the keys of one `rewards:` entry

// The keys only an RL job uses (whole sections such as "rollout" and "rewards", and single keys
// such as "trainer.num_steps_per_rollout"), given a section name and a key: an SFT job that sets
// one is refused, and run_config_to_yaml leaves them out of an SFT job's config (and the `sft`
// section out of an RL job's).
bool rl_only(std::string_view section, std::string_view key);
// The same for a path of Origins ("rollout.seed", "rewards[0].weight", "rewards").
bool rl_only_path(std::string_view path);

// Where each value came from, by path ("rollout.seed", "rewards[0].weight"): "job.yaml:12" for a
// file line, "override rollout.seed=3" for a command-line override. Validation errors start with
// it.
using Origins = std::map<std::string, std::string>;

// Cross-field and range checks; every error on its own line, each prefixed by the origin of the
// key at fault (or config.source when the key kept its default).
Status validate_with_origins(const RunConfig& config, const Origins& origins);

// The candidate nearest to `word` (case-insensitive edit distance, at most 1-3 edits by length),
// or "" when none is close: the X of "did you mean X?".
std::string nearest(std::string_view word, std::span<const std::string_view> candidates);
size_t edit_distance(std::string_view a, std::string_view b);

// The type of a field as words ("an integer", "a list of strings", "one of sync | async").
std::string type_name(const FieldPtr& ptr);

// "a | b | c": the names an enum key accepts.
template <typename E>
std::string enum_choices() {
  std::string out;
  for (std::string_view n : ConfigEnum<E>::names)
    out += (out.empty() ? "" : " | ") + std::string(n);
  return out;
}

// Expands ${VAR} and ${VAR:-default} from the environment; `$${` stands for a literal `${`.
// Errors name the variable (the caller adds the key).
Result<std::string> expand_env(std::string_view text);
// `text` in double quotes, with quotes, backslashes and control characters escaped: for messages,
// and a YAML double-quoted scalar.
std::string double_quoted(std::string_view text);

// The shortest text that reads back as exactly `value` ("0.2", "1e-06", "60").
std::string format_number(double value);

// Escapes text so that expand_env gives it back (`${` → `$${`).
std::string escape_env(std::string_view text);

}  // namespace miles::run_config_internal
