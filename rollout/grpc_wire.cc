// gRPC request messages → engine types (grpc_wire.h).
#include "rollout/grpc_wire.h"

namespace miles::rollout {

Result<GenerateRequest> generate_request_from_proto(const v1::GenerateRequest& in,
                                                    const Tokenizer* tok) {
  GenerateRequest r;
  if (!in.text().empty()) {
    if (!in.input_ids().empty()) return Status::Error("give exactly one of text and input_ids");
    if (!tok)
      return Status::Error("text prompts need a tokenizer; this server has none (send input_ids)");
    r.input_ids = tok->encode(in.text(), /*add_special=*/true);
  } else {
    r.input_ids.assign(in.input_ids().begin(), in.input_ids().end());
  }
  const v1::SamplingParams& sp = in.sampling_params();
  r.sampling.temperature = sp.temperature();
  r.sampling.top_p = sp.top_p() == 0 ? 1.0f : sp.top_p();
  r.sampling.top_k = sp.top_k();
  r.sampling.min_p = sp.min_p();
  r.sampling.seed = sp.seed();
  r.draw_seed = !sp.has_seed();
  r.max_new_tokens = sp.max_new_tokens();
  r.stop_token_ids.assign(sp.stop_token_ids().begin(), sp.stop_token_ids().end());
  r.stop_strings.assign(sp.stop().begin(), sp.stop().end());
  r.ignore_eos = sp.ignore_eos();
  r.n = sp.n() == 0 ? 1 : sp.n();
  return r;
}

PauseMode pause_mode_from_proto(const v1::PauseRequest& in) {
  switch (in.mode()) {
    case v1::PauseRequest::RETRACT:
      return PauseMode::kRetract;
    case v1::PauseRequest::IN_PLACE:
      return PauseMode::kInPlace;
    default:
      return PauseMode::kAbort;
  }
}

}  // namespace miles::rollout
