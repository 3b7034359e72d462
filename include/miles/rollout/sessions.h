// Sessions: the token record of one agentic, multi-turn conversation (TITO, contracts §4), and a
// bounded, thread-safe store of them for the HTTP server's /sessions endpoints.
//
// Why: an agent speaks OpenAI's chat API and resends the whole conversation every turn.
// Re-rendering and re-tokenizing it would change the ids the policy produced (false forks, junction
// tokens), so the session keeps the exact ids and extends them with the appended messages only,
// through ChatTemplate::append_tokens. Per token it keeps what training needs: whether the policy
// generated it (loss mask 1) or not (prompt, appended messages, junction tokens: 0), the sampling
// and raw logprobs and the weight version of generated tokens, and for MoE models the routed
// experts.
//
// How a request maps onto the record (plan_turn):
//   * First call: the messages are rendered with the generation prompt and tokenized.
//   * The request extends the conversation (the messages of earlier calls plus the assistant
//   replies
//     the session returned, compared as JSON with null-valued keys dropped): the messages after the
//     last assistant reply it contains are appended with append_tokens. When that reply is not the
//     session's last one, the later turns are dropped first (the agent branched from an earlier
//     turn).
//   * The request's messages equal those of an earlier call (the agent retries a turn): the record
//     is rolled back to that call's prompt and the turn is generated again; later turns are
//     dropped.
//   * Anything else (an earlier message edited, a template that is not append-only for these
//     messages, a record that does not end where the template ends a turn, e.g. a reply cut by
//     max_tokens) is an error and leaves the session unchanged.
// Nothing changes until commit_turn, after the engine has answered.
#pragma once

#include <cstdint>
#include <list>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <unordered_map>
#include <vector>

#include "miles/chat_template.h"
#include "miles/rollout/engine.h"
#include "miles/status.h"
#include "miles/tokenizer.h"

namespace miles::rollout {

// One call's part of the record: [prompt_start, output_start) are the ids appended before
// generating (the whole prompt on the first call), [output_start, output_end) the generated ids.
struct SessionTurn {
  size_t prompt_start = 0, output_start = 0, output_end = 0;
  size_t num_messages = 0;  // messages of the request; the reply is conversation[num_messages]
  std::string finish_reason;
  // Routed experts of the positions this turn computed first: [experts_start, output_end - 1),
  // flattened [positions, moe layers, top_k] (empty for dense models).
  size_t experts_start = 0;
  std::vector<int32_t> routed_experts;
};

struct Session {
  std::mutex mu;  // held for a whole call: one turn at a time per session
  std::string id;
  nlohmann::ordered_json conversation = nlohmann::ordered_json::array();
  std::vector<int32_t> tokens;
  std::vector<uint8_t> loss_mask;
  std::vector<float> logprobs, raw_logprobs;  // 0 where the mask is 0
  std::vector<int64_t> weight_versions;       // -1 where the mask is 0
  std::vector<SessionTurn> turns;
};

// What a request will do to a session, computed without changing it.
struct TurnPlan {
  size_t keep_tokens = 0;           // record prefix kept
  size_t keep_turns = 0;            // turns kept
  bool retry = false;               // the request repeats turn keep_turns's messages
  std::vector<int32_t> appended;    // ids appended after the kept prefix (empty on a retry)
  std::vector<int32_t> input_ids;   // the engine's input: kept prefix (+ appended)
  nlohmann::ordered_json messages;  // the request's messages
};

// `session` must be locked by the caller.
Result<TurnPlan> plan_turn(const Session& session, const nlohmann::ordered_json& messages,
                           const ChatTemplate& chat, const Tokenizer& tok,
                           const RenderOptions& options);
// Applies a plan and the engine's answer; `reply` is the assistant message returned to the client.
void commit_turn(Session& session, TurnPlan plan, const SampleEvent& fin,
                 const nlohmann::json& reply, int64_t experts_per_token);
// The training sample:
//   tokens            the whole record (prompt, then outputs and appended messages in turn)
//   loss_mask         one per token: 1 on generated ids, 0 elsewhere
//   response_start    index of the first generated token (null before the first turn)
//   rollout_logprobs  the raw-model logprob of each response position [response_start, tokens),
//                     0 where the mask is 0; sampling_logprobs likewise, under the sampling
//                     distribution (temperature, top-p)
//   weight_versions   one per token: the weights that generated it, -1 where the mask is 0
//   turns             [{prompt_start, output_start, output_end, messages, finish_reason}]
//   messages          the conversation (requests' messages and the replies returned)
//   routed_experts    MoE only: flat [tokens - 1, moe layers, top_k] (+ routed_experts_shape),
//                     each position as routed by the turn that first computed it.
nlohmann::json trajectory_json(const Session& session, int64_t experts_per_token,
                               int64_t num_moe_layers);

// Sessions by id, at most `max_sessions`: creating one more drops the least recently used.
class SessionStore {
 public:
  explicit SessionStore(size_t max_sessions);
  // `id` empty: a fresh one. Errors: a bad id (1-128 of [A-Za-z0-9._-]) or one in use.
  Result<std::string> create(const std::string& id);
  std::shared_ptr<Session> get(const std::string& id);  // null when unknown
  bool erase(const std::string& id);
  size_t size() const;

 private:
  mutable std::mutex mu_;
  size_t max_;
  uint64_t next_ = 1;
  uint64_t salt_;
  std::list<std::shared_ptr<Session>> lru_;  // most recent first
  std::unordered_map<std::string, std::list<std::shared_ptr<Session>>::iterator> by_id_;
};

}  // namespace miles::rollout
