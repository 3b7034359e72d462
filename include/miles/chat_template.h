// ChatTemplate: OpenAI-style messages -> the prompt text a model was trained on, and the token ids
// to append to a multi-turn record without re-tokenizing it (TITO).
//
// Why: a Hugging Face model ships its prompt format as a Jinja template (tokenizer_config.json's
// `chat_template`, or GGUF's `tokenizer.chat_template`). The rollout engine must render it exactly
// as transformers' apply_chat_template does, because one byte of difference changes the tokens the
// policy sees. And the session layer of an agentic rollout must extend a conversation's token
// record with the tokens of new messages only: the record holds the ids the model actually
// produced, and a decode -> re-render -> re-encode round trip would silently change them (docs:
// contracts §4, TITO).
//
// Rendering follows transformers 5.x (`apply_chat_template(tokenize=False)`): message keys whose
// value is null are dropped; a message's `reasoning_content` / `thinking` / `reasoning` are aliased
// to each other; the template sees the special tokens (bos_token, eos_token, ...), then the extra
// kwargs, then `messages`, `tools` (none when absent), `documents` (none) and
// `add_generation_prompt`; it runs in jinja2's ImmutableSandboxedEnvironment(trim_blocks=True,
// lstrip_blocks=True) with transformers' tojson (json.dumps, ensure_ascii=False, key order kept),
// raise_exception, strftime_now and the loopcontrols extension. Messages and tools are
// nlohmann::ordered_json so that `tojson` writes keys in the order the caller gave them, as Python
// dicts do; a nlohmann::json converts implicitly (keys sorted).
//
// Supported Jinja: {{ }}, {% %}, {# #}, whitespace control (- and +), raw; if/elif/else, for (tuple
// targets, `if` filter, else, loop.index/index0/revindex/revindex0/first/last/length/previtem/
// nextitem/cycle), break/continue, set (names, tuples, namespace attributes, block set), macro,
// with, filter blocks, generation; literals, arithmetic, comparisons, in / not in, and/or/not, ~, x
// if c else y, attribute/item access, slicing; str/list/dict methods; the filters and tests listed
// in src/chat/jinja_filters.cc and jinja_tests.cc; globals range, namespace, dict, joiner,
// raise_exception, strftime_now. Unknown tags, filters and tests are errors when the template is
// created; runtime errors (undefined values used, type errors, raise_exception) come back from
// render. Known differences from Python: integers are 64-bit (overflow is an error), dict keys are
// strings, str.upper/lower/title cover Latin, Greek and Cyrillic (not all of Unicode), and the
// items(), keys(), reverse and unique results print as lists rather than Python's view/iterator
// reprs.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "miles/status.h"
#include "miles/tokenizer.h"

namespace miles {

struct RenderOptions {
  bool add_generation_prompt = false;
  // null, or an array of OpenAI function-tool schemas:
  // {"type": "function", "function": {"name", "description", "parameters": JSON schema}}.
  nlohmann::ordered_json tools;
  // Extra template variables, e.g. {"enable_thinking": false}; they override the special tokens of
  // the same name and may not be named messages, tools, documents or add_generation_prompt.
  nlohmann::ordered_json kwargs = nlohmann::ordered_json::object();
};

// What append_tokens returns: the ids to append to the token record, and the text they encode.
struct AppendedTokens {
  std::vector<int32_t> ids;  // junction + new messages + generation prompt
  std::string text;          // decode(ids) == text
  size_t junction_size = 0;  // text[0, junction_size) is the junction (see append_tokens)
};

class ChatTemplate {
 public:
  // `source` is the Jinja template; bos_token / eos_token are the strings the template sees as
  // `bos_token` / `eos_token` (empty: not defined). `name` appears in error messages. Errors:
  // syntax errors, unknown tags / filters / tests, each with its line.
  static Result<ChatTemplate> create(std::string_view source, std::string bos_token,
                                     std::string eos_token, std::string name = "chat_template");

  // From a Hugging Face tokenizer_config.json (or the directory holding it): `chat_template` (a
  // string, or a list of {name, template} from which "default" is taken; when absent,
  // chat_template.jinja next to it) and the special tokens bos/eos/unk/pad_token (strings or
  // {"content": ...} objects).
  static Result<ChatTemplate> from_tokenizer_config(const std::string& path);
  // The same from the text of a tokenizer_config.json (`source` names it in errors and is the
  // template's name); `jinja` reads the chat_template.jinja beside it (empty: there is none), only
  // when the config has no chat_template.
  using JinjaFile = std::function<Result<std::string>()>;
  static Result<ChatTemplate> from_tokenizer_config_text(std::string_view text,
                                                         const std::string& source,
                                                         const JinjaFile& jinja);

  // Renders `messages` (an array of OpenAI chat messages: role system / user / assistant / tool;
  // content a string; assistant `tool_calls` [{id, type: "function", function: {name, arguments}}]
  // where `arguments` is passed to the template as given: a JSON string, as the OpenAI API carries
  // it, which Qwen3's template prints verbatim, or an object, which it prints with tojson;
  // `reasoning_content`; tool messages with `tool_call_id`). Errors name the template line, or the
  // message at fault.
  Result<std::string> render(const nlohmann::ordered_json& messages,
                             const RenderOptions& options) const;

  // TITO: the token ids to append to a conversation's token record when `new_messages` (tool
  // results, user turns) follow `messages`, ending with the generation prompt.
  //
  // `record` holds the exact ids of the conversation so far: the prompt and the model's output,
  // which ends with its stop token (e.g. <|im_end|>); `messages` are the same conversation as
  // messages, the last one being the assistant turn the model produced. With
  //   P = render(messages, add_generation_prompt = false)
  //   F = render(messages + new_messages, add_generation_prompt = true)
  //   D = tokenizer.decode(record)
  // the rule is:
  //   1. D must be a prefix of P, else "token record does not match the rendered conversation"
  //      (the messages do not describe what the model produced, or the tokenizer's decode drops
  //      special tokens: it must give their text, as HF's decode(skip_special_tokens=False) does).
  //   2. F must start with P, else the template is not append-only for this conversation: appending
  //      messages re-renders earlier ones (Qwen3 drops the reasoning of turns before the last user
  //      message, and renders the final assistant turn's <think></think> block only while it is the
  //      last message). The error says where the renderings diverge; the record is never
  //      re-tokenized.
  //   3. The junction J = P[len(D):] is what the template writes after the model's stop token and
  //      before the next message ("\n" after <|im_end|> in ChatML, nothing in some templates). It
  //      must be whitespace only: anything else means the record does not end where the template
  //      ends the turn (e.g. a truncated output without its stop token), and is an error.
  //   4. The appended ids are tokenizer.encode(J + F[len(P):], add_special = false): the tokenizer
  //      must recognise special tokens written in the text (<|im_start|> is one id). The junction
  //      tokens are thus environment tokens (loss mask 0), like the new messages.
  // `options.add_generation_prompt` is ignored (P is rendered without, F with a generation prompt).
  Result<AppendedTokens> append_tokens(const Tokenizer& tokenizer,
                                       const nlohmann::ordered_json& messages,
                                       std::span<const int32_t> record,
                                       const nlohmann::ordered_json& new_messages,
                                       const RenderOptions& options) const;

  const std::string& name() const;

 private:
  struct Impl;
  explicit ChatTemplate(std::shared_ptr<const Impl> impl) : impl_(std::move(impl)) {}
  std::shared_ptr<const Impl> impl_;  // immutable: one template may render on many threads
};

}  // namespace miles
