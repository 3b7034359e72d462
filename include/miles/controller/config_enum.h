// Keys of the job file whose value is one of a fixed set of names are enums, parsed and checked
// once when the file loads; nothing downstream compares strings. ConfigEnum<E>::names spells E's
// enumerators, in order, as the YAML does (run_config.h and reward.h specialise it).
#pragma once

#include <array>
#include <cstddef>
#include <string_view>

namespace miles {

template <typename E>
struct ConfigEnum;
template <typename E>
std::string_view name_of(E e) {
  return ConfigEnum<E>::names[static_cast<size_t>(e)];
}

}  // namespace miles
