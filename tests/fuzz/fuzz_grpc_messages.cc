// libFuzzer target: arbitrary bytes as the gRPC request messages the engine and the controller
// receive (proto/miles/v1/rollout.proto, controller.proto). The first byte picks the message type,
// the rest is its wire encoding. A message that parses goes through our conversion
// (rollout/grpc_wire.h: Generate and PauseGeneration requests, with and without a tokenizer), and
// every message must serialize to bytes that parse back to the same message.
#include <google/protobuf/stubs/logging.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string>

#include "miles/tokenizer.h"
#include "miles/v1/controller.pb.h"
#include "miles/v1/rollout.pb.h"
#include "rollout/grpc_wire.h"
#include "tests/fuzz/fuzz_tokenizer.h"

namespace {

// Parses `bytes` as M; a parsed message re-encodes to bytes that parse to the same encoding.
template <typename M>
bool parse(const uint8_t* bytes, size_t size, M& m) {
  if (!m.ParseFromArray(bytes, static_cast<int>(size))) return false;
  const std::string wire = m.SerializeAsString();
  M again;
  if (!again.ParseFromString(wire) || again.SerializeAsString() != wire) std::abort();
  return true;
}

}  // namespace

// protobuf logs every string field that is not UTF-8; the fuzzer makes many.
extern "C" int LLVMFuzzerInitialize(int*, char***) {
  google::protobuf::SetLogHandler(nullptr);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  namespace pb = miles::v1;
  const uint8_t* body = data + 1;
  const size_t n = size - 1;
  switch (data[0] % 8) {
    case 0: {
      pb::GenerateRequest m;
      if (!parse(body, n, m)) break;
      for (const miles::Tokenizer* tok :
           {miles::fuzz::test_tokenizer(), static_cast<const miles::Tokenizer*>(nullptr)})
        (void)miles::rollout::generate_request_from_proto(m, tok);
      break;
    }
    case 1: {
      pb::PauseRequest m;
      if (parse(body, n, m)) (void)miles::rollout::pause_mode_from_proto(m);
      break;
    }
    case 2: {
      pb::AbortRequest m;
      parse(body, n, m);
      break;
    }
    case 3: {
      pb::UpdateWeightsFromDiskRequest m;
      parse(body, n, m);
      break;
    }
    case 4: {
      pb::UpdateWeightVersionRequest m;
      parse(body, n, m);
      break;
    }
    case 5: {
      pb::RegisterEngineRequest m;
      parse(body, n, m);
      break;
    }
    case 6: {
      pb::StopRequest m;
      parse(body, n, m);
      break;
    }
    default: {
      pb::ControllerStatusRequest m;
      parse(body, n, m);
      break;
    }
  }
  return 0;
}
