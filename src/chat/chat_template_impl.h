// What a ChatTemplate holds (private to src/chat): the parsed template and the special tokens.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "chat/jinja.h"
#include "miles/chat_template.h"

namespace miles {

struct ChatTemplate::Impl {
  jinja::Template tmpl;
  std::vector<std::pair<std::string, std::string>> special_tokens;  // bos_token, eos_token, ...
};

}  // namespace miles
