// The reply shapes of http_reply.h: a body at the end with a heartbeat, or an event stream.
#include "rollout/http_reply.h"

#include <httplib.h>

#include <chrono>

#include "rollout/openai_api.h"

namespace miles::rollout {

size_t SubmittedPrompts::prompt_of(uint64_t engine_id) const {
  for (size_t p = 0; p < engine_ids.size(); ++p)
    if (engine_ids[p] == engine_id) return p;
  return 0;
}

std::string sse_line(const nlohmann::json& chunk) { return "data: " + dump_json(chunk) + "\n\n"; }

void reply_at_end(httplib::Response& res, ReplySamples samples,
                  std::function<void(SampleEvent&)> on_final, std::function<std::string()> body) {
  auto done = std::make_shared<int32_t>(0);
  res.set_chunked_content_provider(
      "application/json", [samples = std::move(samples), on_final = std::move(on_final),
                           body = std::move(body), done](size_t, httplib::DataSink& sink) {
        const auto beat = std::chrono::steady_clock::now() + std::chrono::seconds(1);
        while (*done < samples.sub->total && std::chrono::steady_clock::now() < beat) {
          SampleEvent ev;
          if (!samples.sub->stream->next(ev, 200) || !ev.finished) continue;
          on_final(ev);
          ++*done;
        }
        if (*done < samples.sub->total) {
          if (sink.write(" ", 1)) return true;
          samples.abort_all();
          return false;
        }
        const std::string text = body();
        sink.write(text.data(), text.size());
        sink.done();
        return true;
      });
}

void reply_as_events(httplib::Response& res, ReplySamples samples, SseReply reply) {
  struct Progress {
    bool opened = false;
    int32_t finished = 0;
  };
  auto progress = std::make_shared<Progress>();
  res.set_chunked_content_provider(
      "text/event-stream", [samples = std::move(samples), reply = std::move(reply),
                            progress](size_t, httplib::DataSink& sink) {
        const auto write_or_abort = [&](const std::string& text) {
          if (text.empty() || sink.write(text.data(), text.size())) return true;
          samples.abort_all();
          return false;
        };
        if (!progress->opened) {
          progress->opened = true;
          const std::string opening = reply.opening ? reply.opening() : "";
          if (!opening.empty()) return write_or_abort(opening);
        }
        if (progress->finished == samples.sub->total) {
          const std::string tail = (reply.closing ? reply.closing() : "") + "data: [DONE]\n\n";
          sink.write(tail.data(), tail.size());
          sink.done();
          return true;
        }
        SampleEvent ev;
        if (!samples.sub->stream->next(ev, 200)) {
          if (sink.is_writable()) return true;
          samples.abort_all();  // the client has gone: free its KV blocks now
          return false;
        }
        const std::string chunk = reply.on_event(ev);
        if (ev.finished && ++progress->finished == samples.sub->total && reply.all_finished)
          reply.all_finished();
        return write_or_abort(chunk);
      });
}

}  // namespace miles::rollout
