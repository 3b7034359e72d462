// The two shapes of a generation reply over HTTP, shared by /generate and the OpenAI routes: one
// JSON body once every sample has finished, or a server-sent-event stream of the samples' events.
//
// Why: both routes wait on a RequestStream for the same events and must notice the same way that
// a client has gone (and abort its samples, freeing their KV blocks); only the JSON differs. Each
// route keeps its own JSON and hands it to these as callbacks.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "miles/rollout/engine_driver.h"

namespace httplib {
struct Response;
}

namespace miles::rollout {

// The samples of one HTTP request in the engine: an engine request per prompt, `n` samples each,
// every event on `stream`. The reply orders them prompt-major: sample j of prompt p is at
// first[p] + j (SGLang's order for /generate, OpenAI's choice index).
struct SubmittedPrompts {
  std::shared_ptr<RequestStream> stream = std::make_shared<RequestStream>();
  std::vector<uint64_t> engine_ids;  // per prompt
  std::vector<int32_t> first;        // per prompt
  int32_t total = 0;
  // The prompt an event belongs to (0 for an id of no prompt: never sent on this stream).
  size_t prompt_of(uint64_t engine_id) const;
  int32_t index_of(const SampleEvent& ev) const {
    return first[prompt_of(ev.request_id)] + ev.sample_index;
  }
};

// A reply's samples (their stream and count) and how to abort them all (a client that has gone).
struct ReplySamples {
  std::shared_ptr<const SubmittedPrompts> sub;
  std::function<void()> abort_all;
};

// One JSON body at the end, `body()` called once every sample's final event went to
// `on_final`; meanwhile a space (JSON allows leading whitespace) every second, so that a client
// that has gone is noticed within a second and its samples aborted.
void reply_at_end(httplib::Response& res, ReplySamples samples,
                  std::function<void(SampleEvent&)> on_final, std::function<std::string()> body);

// A text/event-stream: `opening()` first (chunks before any event; may be empty), then for each
// event of the samples the chunk `on_event` returns ("data: ...\n\n" lines), then `closing()` and
// "data: [DONE]" once every sample has finished. A chunk the client does not take, or a client
// that is gone while no event comes, aborts the samples.
struct SseReply {
  std::function<std::string()> opening;  // optional
  std::function<std::string(const SampleEvent&)> on_event;
  std::function<void()> all_finished;    // optional: once the last final event was handed on
  std::function<std::string()> closing;  // optional
};
void reply_as_events(httplib::Response& res, ReplySamples samples, SseReply reply);

// "data: <json>\n\n", the JSON with invalid UTF-8 replaced.
std::string sse_line(const nlohmann::json& chunk);

}  // namespace miles::rollout
