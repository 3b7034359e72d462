// Finding the model and tokenizer a command was pointed at.
#pragma once

#include <memory>
#include <string>

#include "miles/model.h"
#include "miles/tokenizer.h"

namespace miles::cli {

// --tokenizer when given; otherwise beside the model: the HF directory itself, or for a llama2.c file
// tok{vocab}.bin or tokenizer.bin in the same directory.
Result<std::unique_ptr<Tokenizer>> find_tokenizer(const std::string& model_path,
                                                  const std::string& tokenizer_path,
                                                  int32_t vocab_size);

// Prints "miles <command>: <message>" to stderr and returns the exit code 1.
int fail(const char* command, const std::string& message);

}  // namespace miles::cli
