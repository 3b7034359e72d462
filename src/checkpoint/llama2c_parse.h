// parse_llama2c: the llama2.c reader on bytes already in memory (read_llama2c maps the file and
// calls it; the fuzzer calls it directly).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "miles/checkpoint.h"

namespace miles {

// `source` names the file in errors; `owner` keeps `data` alive for the returned tensor views.
Result<Llama2cModel> parse_llama2c(const uint8_t* data, size_t size, const std::string& source,
                                   std::shared_ptr<const void> owner);

}  // namespace miles
