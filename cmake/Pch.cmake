# MILES_PCH=ON: the heavy third-party headers most translation units include (JSON, HTTP, gRPC,
# logging) are precompiled once per library instead of parsed by every file: about a third less
# compile time for a from-scratch build (scripts/quickstart.sh turns it on). C++ sources only.
option(MILES_PCH "Precompile the heavy third-party headers" OFF)
set(MILES_PCH_HEADERS
    <algorithm> <functional> <map> <memory> <mutex> <string> <thread> <vector>
    <nlohmann/json.hpp> <spdlog/spdlog.h> <httplib.h> <grpcpp/grpcpp.h>)

function(miles_precompile_headers target)
  if(NOT MILES_PCH)
    return()
  endif()
  foreach(h ${MILES_PCH_HEADERS})
    target_precompile_headers(${target} PRIVATE "$<$<COMPILE_LANGUAGE:CXX>:${h}>")
  endforeach()
endfunction()
