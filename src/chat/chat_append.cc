// TITO: the ids to append to a token record for new messages (the rule is documented in
// include/miles/chat_template.h, append_tokens).
#include <algorithm>

#include "chat/chat_template_impl.h"
#include "chat/py_text.h"

namespace miles {
namespace {

constexpr size_t kExcerpt = 40;  // bytes of context shown on each side of a divergence

size_t first_difference(std::string_view a, std::string_view b) {
  const size_t n = std::min(a.size(), b.size());
  size_t i = 0;
  while (i < n && a[i] == b[i]) ++i;
  return i;
}

// s[from, to) widened to UTF-8 boundaries, with control characters escaped, quoted.
std::string excerpt(std::string_view s, size_t from, size_t to) {
  from = std::min(from, s.size());
  to = std::min(to, s.size());
  while (from > 0 && (static_cast<unsigned char>(s[from]) & 0xC0) == 0x80) --from;
  while (to < s.size() && (static_cast<unsigned char>(s[to]) & 0xC0) == 0x80) ++to;
  std::string out = "\"";
  if (from > 0) out += "...";
  for (char c : s.substr(from, to - from)) {
    if (c == '\n') {
      out += "\\n";
    } else if (c == '\t') {
      out += "\\t";
    } else if (c == '"') {
      out += "\\\"";
    } else if (static_cast<unsigned char>(c) < 0x20) {
      out += "\\x" + std::string(1, "0123456789abcdef"[(c >> 4) & 0xF]) +
             std::string(1, "0123456789abcdef"[c & 0xF]);
    } else {
      out += c;
    }
  }
  if (to < s.size()) out += "...";
  return out + "\"";
}

// "at byte N: A has "...x..." where B has "...y..."".
std::string divergence(std::string_view a, const char* a_name, std::string_view b,
                       const char* b_name) {
  const size_t at = first_difference(a, b);
  const size_t from = at > kExcerpt ? at - kExcerpt : 0;
  return "at byte " + std::to_string(at) + ", " + a_name + " has " +
         excerpt(a, from, at + kExcerpt) + " where " + b_name + " has " +
         excerpt(b, from, at + kExcerpt);
}

bool is_whitespace(std::string_view s) {
  for (size_t i = 0; i < s.size();)
    if (!py::is_space(py::next_cp(s, i))) return false;
  return true;
}

}  // namespace

Result<AppendedTokens> ChatTemplate::append_tokens(const Tokenizer& tokenizer,
                                                   const nlohmann::ordered_json& messages,
                                                   std::span<const int32_t> record,
                                                   const nlohmann::ordered_json& new_messages,
                                                   const RenderOptions& options) const {
  if (!new_messages.is_array() || new_messages.empty())
    return Status::Error("append_tokens: new_messages must be a non-empty JSON array");
  if (record.empty()) return Status::Error("append_tokens: the token record is empty");
  for (size_t i = 0; i < record.size(); ++i)
    if (record[i] < 0 || record[i] >= tokenizer.vocab_size())
      return Status::Error(
          "append_tokens: record[" + std::to_string(i) + "] = " + std::to_string(record[i]) +
          " is not a token id (vocabulary size " + std::to_string(tokenizer.vocab_size()) + ")");

  RenderOptions opts = options;
  opts.add_generation_prompt = false;
  auto p = render(messages, opts);
  if (!p.ok()) return p.status().with_context("append_tokens: rendering the recorded messages");
  const std::string& P = p.value();
  nlohmann::ordered_json all = messages;
  if (all.is_array())
    for (const auto& m : new_messages) all.push_back(m);
  opts.add_generation_prompt = true;
  auto f = render(all, opts);
  if (!f.ok()) return f.status().with_context("append_tokens: rendering with the new messages");
  const std::string& F = f.value();

  const std::string D = tokenizer.decode(record);
  if (D.size() > P.size() || P.compare(0, D.size(), D) != 0)
    return Status::Error(
        "append_tokens: token record does not match the rendered conversation: " +
        divergence(D, "the decoded record", P, "the rendered messages") +
        " (the messages must describe exactly what the model produced, and the tokenizer's decode "
        "must keep special tokens)");
  if (F.compare(0, P.size(), P) != 0)
    return Status::Error(
        "append_tokens: chat template '" + name() +
        "' is not append-only for this conversation: appending the new messages re-renders the "
        "earlier ones, " +
        divergence(P, "the rendering without them", F, "the rendering with them") +
        "; the token record cannot be extended without re-tokenizing it (e.g. Qwen3 drops the "
        "reasoning of turns before the last user message and renders the final assistant turn's "
        "<think></think> block only while it is the last message)");
  const std::string_view J = std::string_view(P).substr(D.size());
  if (!is_whitespace(J))
    return Status::Error(
        "append_tokens: the template writes " + excerpt(J, 0, J.size()) +
        " after the recorded tokens; only whitespace may follow the model's stop token (does the "
        "record end with the stop token, e.g. a truncated output?)");

  AppendedTokens out;
  out.junction_size = J.size();
  out.text = std::string(J) + F.substr(P.size());
  out.ids = tokenizer.encode(out.text, /*add_special=*/false);
  const std::string round_trip = tokenizer.decode(out.ids);
  if (round_trip != out.text)
    return Status::Error(
        "append_tokens: the tokenizer does not decode its own encoding of the "
        "appended text back to it, " +
        divergence(round_trip, "decode(encode(text))", out.text, "the text"));
  return out;
}

}  // namespace miles
