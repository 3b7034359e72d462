// Sessions: planning a turn against the token record (append, branch or retry), committing the
// engine's answer, the trajectory as one training sample, and the LRU store.
#include "miles/rollout/sessions.h"

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <random>

namespace miles::rollout {

using nlohmann::json;
using nlohmann::ordered_json;

namespace {

// A message as compared between requests: key order ignored, null-valued keys dropped (as the
// chat template never sees them).
json normalized(const ordered_json& message) {
  json j = message;
  if (j.is_object())
    for (auto it = j.begin(); it != j.end();) it = it->is_null() ? j.erase(it) : std::next(it);
  return j;
}

// How many leading messages of `a` and `b` are equal.
size_t common_prefix(const ordered_json& a, const ordered_json& b) {
  const size_t n = std::min(a.size(), b.size());
  size_t i = 0;
  while (i < n && normalized(a[i]) == normalized(b[i])) ++i;
  return i;
}

ordered_json slice(const ordered_json& messages, size_t begin, size_t end) {
  ordered_json out = ordered_json::array();
  for (size_t i = begin; i < end; ++i) out.push_back(messages[i]);
  return out;
}

std::string describe(const ordered_json& message) {
  return message.is_object() && message.contains("role") ? message["role"].dump() : "?";
}

}  // namespace

Result<TurnPlan> plan_turn(const Session& s, const ordered_json& messages, const ChatTemplate& chat,
                           const Tokenizer& tok, const RenderOptions& options) {
  if (!messages.is_array() || messages.empty())
    return Status::Error("messages must be a non-empty list");
  TurnPlan p;
  p.messages = messages;
  const size_t n = messages.size();
  if (s.turns.empty()) {
    RenderOptions o = options;
    o.add_generation_prompt = true;
    MILES_ASSIGN_OR_RETURN(std::string text, chat.render(messages, o));
    p.appended = tok.encode(text, /*add_special=*/false);
    p.input_ids = p.appended;
    return p;
  }
  const ordered_json& conv = s.conversation;
  const size_t same = common_prefix(messages, conv);
  // A retry: exactly the messages of an earlier call.
  for (size_t k = 0; k < s.turns.size(); ++k) {
    if (s.turns[k].num_messages != n || same < n) continue;
    p.retry = true;
    p.keep_turns = k;
    p.keep_tokens = s.turns[k].output_start;
    p.input_ids.assign(s.tokens.begin(), s.tokens.begin() + p.keep_tokens);
    return p;
  }
  // An extension of the conversation through the reply of turn k (the latest such turn).
  for (size_t k = s.turns.size(); k-- > 0;) {
    const size_t through = s.turns[k].num_messages + 1;
    if (same < through || n <= through) continue;
    p.keep_turns = k + 1;
    p.keep_tokens = s.turns[k].output_end;
    const std::span<const int32_t> record(s.tokens.data(), p.keep_tokens);
    auto appended = chat.append_tokens(tok, slice(messages, 0, through), record,
                                       slice(messages, through, n), options);
    if (!appended.ok())
      return Status::Error("the appended messages cannot extend the session's token record: " +
                           appended.message());
    p.appended = std::move(appended->ids);
    p.input_ids.assign(record.begin(), record.end());
    p.input_ids.insert(p.input_ids.end(), p.appended.begin(), p.appended.end());
    return p;
  }
  if (same < std::min(n, conv.size()))
    return Status::Error("message " + std::to_string(same) + " (" + describe(messages[same]) +
                         ") differs from the session's conversation: a session only appends "
                         "messages after an assistant reply it returned (or repeats an earlier "
                         "call's messages to retry it); start a new session to edit earlier turns");
  return Status::Error("the " + std::to_string(n) +
                       " messages end inside the session's conversation without repeating an "
                       "earlier call's messages; append user or tool messages after the last "
                       "assistant reply");
}

void commit_turn(Session& s, TurnPlan plan, const SampleEvent& fin, const json& reply,
                 int64_t experts_per_token) {
  SessionTurn t;
  t.prompt_start = plan.retry ? s.turns[plan.keep_turns].prompt_start : plan.keep_tokens;
  t.num_messages = plan.messages.size();
  t.finish_reason = finish_reason_name(fin.finish_reason);
  s.turns.resize(plan.keep_turns);
  const size_t keep = plan.keep_tokens;
  s.tokens.resize(keep);
  s.loss_mask.resize(keep);
  s.logprobs.resize(keep);
  s.raw_logprobs.resize(keep);
  s.weight_versions.resize(keep);
  for (int32_t id : plan.appended) {
    s.tokens.push_back(id);
    s.loss_mask.push_back(0);
    s.logprobs.push_back(0);
    s.raw_logprobs.push_back(0);
    s.weight_versions.push_back(-1);
  }
  t.output_start = s.tokens.size();
  for (const TokenOutput& o : fin.output) {
    s.tokens.push_back(o.id);
    s.loss_mask.push_back(1);
    s.logprobs.push_back(o.logprob);
    s.raw_logprobs.push_back(o.raw_logprob);
    s.weight_versions.push_back(o.weight_version);
  }
  t.output_end = s.tokens.size();
  // The engine reports experts for positions [0, input + output - 1) of this call; earlier turns
  // already hold those before their own end.
  t.experts_start = s.turns.empty() ? 0 : s.turns.back().output_end - 1;
  if (experts_per_token > 0 && t.output_end > 0) {
    const size_t per = static_cast<size_t>(experts_per_token);
    const size_t begin = std::min(t.experts_start * per, fin.routed_experts.size());
    const size_t end = std::min((t.output_end - 1) * per, fin.routed_experts.size());
    if (end > begin)
      t.routed_experts.assign(fin.routed_experts.begin() + begin, fin.routed_experts.begin() + end);
  }
  s.conversation = std::move(plan.messages);
  s.conversation.push_back(ordered_json(reply));
  s.turns.push_back(std::move(t));
}

json trajectory_json(const Session& s, int64_t experts_per_token, int64_t num_moe_layers) {
  json turns = json::array();
  for (const SessionTurn& t : s.turns)
    turns.push_back({{"prompt_start", t.prompt_start},
                     {"output_start", t.output_start},
                     {"output_end", t.output_end},
                     {"messages", t.num_messages},
                     {"finish_reason", t.finish_reason}});
  // Logprobs are aligned with the response, [response_start, tokens): one per position, 0 where
  // the loss mask is 0 (appended messages between turns).
  const size_t start = s.turns.empty() ? s.tokens.size() : s.turns[0].output_start;
  json j = {{"session_id", s.id},
            {"tokens", s.tokens},
            {"loss_mask", s.loss_mask},
            {"rollout_logprobs",
             std::vector<float>(s.raw_logprobs.begin() + start, s.raw_logprobs.end())},
            {"sampling_logprobs", std::vector<float>(s.logprobs.begin() + start, s.logprobs.end())},
            {"weight_versions", s.weight_versions},
            {"response_start", s.turns.empty() ? json() : json(s.turns[0].output_start)},
            {"turns", turns},
            {"messages", json(s.conversation)}};
  if (experts_per_token > 0) {
    std::vector<int32_t> experts;
    for (const SessionTurn& t : s.turns)
      experts.insert(experts.end(), t.routed_experts.begin(), t.routed_experts.end());
    const int64_t layers = std::max<int64_t>(1, num_moe_layers);
    j["routed_experts_shape"] = {static_cast<int64_t>(experts.size()) / experts_per_token, layers,
                                 experts_per_token / layers};
    j["routed_experts"] = std::move(experts);
  }
  return j;
}

SessionStore::SessionStore(size_t max_sessions)
    : max_(std::max<size_t>(1, max_sessions)), salt_(std::random_device{}()) {}

Result<std::string> SessionStore::create(const std::string& requested) {
  std::string id = requested;
  if (!id.empty()) {
    const bool ok =
        id.size() <= 128 && std::all_of(id.begin(), id.end(), [](char c) {
          return std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' || c == '-';
        });
    if (!ok) return Status::Error("session_id must be 1-128 characters of [A-Za-z0-9._-]");
  }
  std::lock_guard<std::mutex> lock(mu_);
  if (id.empty()) {
    char buf[64];
    std::snprintf(buf, sizeof(buf), "sess-%08llx-%llu", static_cast<unsigned long long>(salt_),
                  static_cast<unsigned long long>(next_++));
    id = buf;
  }
  if (by_id_.count(id)) return Status::Error("session '" + id + "' exists");
  while (by_id_.size() >= max_) {
    by_id_.erase(lru_.back()->id);
    lru_.pop_back();
  }
  auto session = std::make_shared<Session>();
  session->id = id;
  lru_.push_front(std::move(session));
  by_id_[id] = lru_.begin();
  return id;
}

std::shared_ptr<Session> SessionStore::get(const std::string& id) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = by_id_.find(id);
  if (it == by_id_.end()) return nullptr;
  lru_.splice(lru_.begin(), lru_, it->second);
  return *it->second;
}

bool SessionStore::erase(const std::string& id) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = by_id_.find(id);
  if (it == by_id_.end()) return false;
  lru_.erase(it->second);
  by_id_.erase(it);
  return true;
}

size_t SessionStore::size() const {
  std::lock_guard<std::mutex> lock(mu_);
  return by_id_.size();
}

}  // namespace miles::rollout
