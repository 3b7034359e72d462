// rollout.function: the user's own rollout — an `async def fn(client, sample)` in Python (slime's
// --custom-generate-function-path) — run for each sample by the embedded CPython
// (python_embed.h).
//
// Why: agent environments, tool loops and custom sampling are written in Python. The function
// drives the engines through its `client`; every `await client.chat(messages)` is one model turn of
// the sample's TITO session (the GroupRunner plans it on the session's exact token record, the
// engines generate it, the record keeps their ids and logprobs), so what the trainer consumes is
// exactly what was generated, whatever the Python does between turns. Calls into the engines run
// on Python's worker threads with the GIL released, so the samples of all groups generate side by
// side. What the function returns (None, a number, a dict: JSON) is kept on the sample and scored
// by `kind: rollout` rewards; what it raises is kept as the sample's error, with the traceback.
//
// The client, as the function sees it:
//   client.sample                     the dict the function also gets as `sample`: {"messages",
//                                     "prompt", "label", "row", "index"} (index within the group)
//   await client.chat(messages, *, tools=None, max_new_tokens=None, stop=None,
//                     chat_template_kwargs=None)
//       one model turn: `messages` must extend the conversation so far (the previous request plus
//       the reply; the session's append-only rule, rollout/sessions.h). Returns {"content",
//       "finish_reason", "completion_tokens", "messages"} ("messages": the conversation with the
//       reply). Raises ValueError when the messages cannot extend the record (an earlier message
//       edited, a template that is not append-only for them, a reply cut by max_new_tokens: the
//       session is unchanged), RuntimeError when the engines fail or past rollout.max_turns turns.
//   await client.generate(text=None, *, input_ids=None, max_new_tokens=None, stop=None)
//       a plain completion outside the record (not trained): {"text", "ids", "finish_reason"};
//       the text is tokenized without special tokens; at most rollout.max_turns per sample.
// Sampling is the run's (temperature, top_p, top_k, seeds derived from the sample's): a function
// that makes the same calls gets the same tokens.
#pragma once

#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "miles/status.h"

namespace miles::controller {

// What a sample's client asks of the runner. Called on a Python worker thread without the GIL;
// an error is raised in Python as RuntimeError with its message.
class RolloutHost {
 public:
  virtual ~RolloutHost() = default;
  // op: "chat" or "generate"; `request` as the client built it, its keys in the order Python
  // wrote them (a chat template renders tool schemas in that order).
  virtual Result<nlohmann::json> call(const std::string& op,
                                      const nlohmann::ordered_json& request) = 0;
};

struct RolloutOutcome {
  nlohmann::json result;  // what the function returned (null for None)
  std::string error;      // non-empty when it raised (or returned something not JSON): traceback
};

class RolloutFunction {
 public:
  // Imports `function` ("package.module:name") with `python_path` first on sys.path; an import
  // error, a missing name or a function that is not `async def` is an error naming it.
  static Result<std::unique_ptr<RolloutFunction>> load(const std::string& function,
                                                       const std::string& python_path);
  ~RolloutFunction();
  RolloutFunction(const RolloutFunction&) = delete;
  RolloutFunction& operator=(const RolloutFunction&) = delete;
  const std::string& name() const { return function_; }
  // Runs fn(client, sample) to its end on the calling thread (its own event loop). Thread-safe.
  RolloutOutcome run(const nlohmann::ordered_json& sample, RolloutHost& host) const;

 private:
  RolloutFunction(void* fn, std::string function) : fn_(fn), function_(std::move(function)) {}
  void* fn_;  // the function (a strong reference to a PyObject)
  std::string function_;
};

}  // namespace miles::controller
