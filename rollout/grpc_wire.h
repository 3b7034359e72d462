// Conversions between the RolloutEngine gRPC messages (proto/miles/v1/rollout.proto) and the
// engine's types, for GrpcServer (grpc_server.cc).
//
// Why: the bytes of a gRPC call come from outside; keeping their conversion out of the service
// class gives it one place to validate, and lets a fuzzer (tests/fuzz/fuzz_grpc_messages.cc) run it
// without a server. Errors are what the service returns as INVALID_ARGUMENT.
#pragma once

#include "miles/rollout/engine.h"
#include "miles/status.h"
#include "miles/tokenizer.h"
#include "miles/v1/rollout.pb.h"

namespace miles::rollout {

// A Generate call's request: the prompt (input_ids, or text encoded with `tok`, BOS included) and
// its sampling parameters (top_p 0 and n 0 are read as 1; no seed: the engine draws one). Errors:
// both text and input_ids, or text without a tokenizer. Range checks (vocabulary, context, n, the
// sampling parameters) are the engine's, in Engine::submit.
Result<GenerateRequest> generate_request_from_proto(const v1::GenerateRequest& in,
                                                    const Tokenizer* tok);

// PauseGeneration's mode (an unknown value is ABORT, proto3's default).
PauseMode pause_mode_from_proto(const v1::PauseRequest& in);

}  // namespace miles::rollout
