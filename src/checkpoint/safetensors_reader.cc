// Safetensors reader: header validation, then Tensor views into the memory-mapped data buffer.
//
// Why: a checkpoint is untrusted input. Layout: u64 little-endian header length N, N bytes of JSON
// ({name: {dtype, shape, data_offsets: [begin, end]}, "__metadata__": {str: str}}), then the data
// buffer, offsets relative to its start. Like the reference (Rust) implementation we require the
// tensors to cover the buffer exactly: no overlap, no hole, no trailing byte, no duplicate name.
// Every check runs before any byte is exposed; errors name the file and the tensor.
#include <algorithm>
#include <cstring>
#include <set>

#include "checkpoint/mapped_file.h"
#include "miles/checkpoint.h"
#include "miles/json_text.h"
#include "nlohmann/json.hpp"

namespace miles {
namespace {

using json = nlohmann::json;

constexpr uint64_t kMaxHeaderBytes = 100ull << 20;  // the reference reader's limit

struct Entry {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;  // outermost first
  uint64_t begin = 0;          // [begin, end) in the data buffer
  uint64_t end = 0;
};

struct Header {
  std::vector<Entry> entries;
  std::map<std::string, std::string> metadata;
  const uint8_t* buffer = nullptr;  // start of the data buffer
  uint64_t buffer_size = 0;
};

Status tensor_error(const std::string& name, const std::string& source, const std::string& what) {
  return Status::Error("tensor '" + name + "' in " + source + " " + what);
}

bool as_u64(const json& v, uint64_t* out) {
  if (!v.is_number_integer() || (!v.is_number_unsigned() && v.get<int64_t>() < 0)) return false;
  *out = v.get<uint64_t>();
  return true;
}

std::string shape_str(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

Status parse_entry(const std::string& name, const json& v, const Header& h,
                   const std::string& source, Entry* e) {
  e->name = name;
  if (!v.is_object()) return tensor_error(name, source, "is not a JSON object");
  auto dt = v.find("dtype");
  if (dt == v.end() || !dt->is_string()) return tensor_error(name, source, "has no string 'dtype'");
  const auto dtype = dtype_from_name(dt->get<std::string>());
  if (!dtype)
    return tensor_error(name, source, "has unknown dtype '" + dt->get<std::string>() + "'");
  e->dtype = *dtype;
  auto sh = v.find("shape");
  if (sh == v.end() || !sh->is_array()) return tensor_error(name, source, "has no 'shape' list");
  int64_t numel = 1;
  for (const json& d : *sh) {
    uint64_t dim = 0;
    if (!as_u64(d, &dim) || dim > static_cast<uint64_t>(INT64_MAX))
      return tensor_error(name, source, "has a shape entry that is not a non-negative integer");
    e->shape.push_back(static_cast<int64_t>(dim));
    if (__builtin_mul_overflow(numel, static_cast<int64_t>(dim), &numel))
      return tensor_error(name, source, "has a shape whose element count overflows");
  }
  int64_t nbytes = 0;
  if (__builtin_mul_overflow(numel, static_cast<int64_t>(dtype_size(e->dtype)), &nbytes))
    return tensor_error(name, source, "has a shape whose byte size overflows");
  auto off = v.find("data_offsets");
  if (off == v.end() || !off->is_array() || off->size() != 2 || !as_u64((*off)[0], &e->begin) ||
      !as_u64((*off)[1], &e->end))
    return tensor_error(name, source,
                        "needs 'data_offsets': [begin, end] of non-negative integers");
  const std::string range = "[" + std::to_string(e->begin) + ", " + std::to_string(e->end) + ")";
  if (e->begin > e->end)
    return tensor_error(name, source, "has data_offsets " + range + " reversed");
  if (e->end > h.buffer_size)
    return tensor_error(name, source,
                        "has data_offsets " + range + " past the end of the " +
                            std::to_string(h.buffer_size) + "-byte data buffer");
  if (e->end - e->begin != static_cast<uint64_t>(nbytes))
    return tensor_error(name, source,
                        "has " + std::to_string(e->end - e->begin) + " bytes in data_offsets " +
                            range + " but shape " + shape_str(e->shape) + " of " +
                            std::string(dtype_name(e->dtype)) + " needs " + std::to_string(nbytes));
  return Status::Ok();
}

Status parse_metadata(const json& v, const std::string& source, Header* h) {
  if (!v.is_object()) return Status::Error(source + ": '__metadata__' is not a JSON object");
  for (const auto& [key, value] : v.items()) {
    if (!value.is_string())
      return Status::Error(source + ": '__metadata__' value of '" + key + "' is not a string");
    h->metadata[key] = value.get<std::string>();
  }
  return Status::Ok();
}

// Sorted by offset, the tensors must tile the data buffer exactly.
Status check_coverage(std::vector<const Entry*> order, const Header& h, const std::string& source) {
  std::sort(order.begin(), order.end(), [](const Entry* a, const Entry* b) {
    return a->begin != b->begin ? a->begin < b->begin : a->end < b->end;
  });
  uint64_t covered = 0;
  const Entry* prev = nullptr;
  for (const Entry* e : order) {
    if (e->begin < covered)
      return tensor_error(e->name, source, "overlaps tensor '" + prev->name + "'");
    if (e->begin > covered)
      return tensor_error(e->name, source,
                          "starts at " + std::to_string(e->begin) + ", leaving a hole after byte " +
                              std::to_string(covered) + " of the data buffer");
    covered = e->end;
    prev = e;
  }
  if (covered != h.buffer_size)
    return Status::Error(source + ": data buffer has " + std::to_string(h.buffer_size) +
                         " bytes but the tensors cover " + std::to_string(covered));
  return Status::Ok();
}

Result<Header> parse_header(const uint8_t* data, size_t size, const std::string& source) {
  if (size < 8)
    return Status::Error(source + ": file is " + std::to_string(size) +
                         " bytes, too short for the 8-byte safetensors header length");
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | data[i];
  if (n > kMaxHeaderBytes || n > size - 8)
    return Status::Error(source + ": header length " + std::to_string(n) + " is larger than " +
                         (n > kMaxHeaderBytes ? std::string("the 100 MB limit")
                                              : "the file (" + std::to_string(size) + " bytes)"));
  // Duplicate names are an error (json would silently keep the last one).
  std::set<std::string> seen;
  std::string duplicate;
  auto on_event = [&](int depth, json::parse_event_t event, json& parsed) {
    if (depth == 1 && event == json::parse_event_t::key && duplicate.empty() &&
        !seen.insert(parsed.get<std::string>()).second)
      duplicate = parsed.get<std::string>();
    return true;
  };
  json j;
  if (!json_depth_ok(std::string_view(reinterpret_cast<const char*>(data) + 8, n)))
    return Status::Error(source + ": header is not valid JSON: arrays and objects nest more than " +
                         std::to_string(kMaxJsonDepth) + " levels deep");
  try {
    j = json::parse(data + 8, data + 8 + n, on_event);
  } catch (const json::exception& e) {
    return Status::Error(source + ": header is not valid JSON: " + e.what());
  }
  if (!j.is_object()) return Status::Error(source + ": header is not a JSON object");
  if (!duplicate.empty()) return tensor_error(duplicate, source, "is defined twice in the header");
  Header h;
  h.buffer = data + 8 + n;
  h.buffer_size = size - 8 - n;
  for (const auto& [name, value] : j.items()) {
    if (name == "__metadata__") {
      MILES_RETURN_IF_ERROR(parse_metadata(value, source, &h));
      continue;
    }
    Entry e;
    MILES_RETURN_IF_ERROR(parse_entry(name, value, h, source, &e));
    h.entries.push_back(std::move(e));
  }
  std::vector<const Entry*> order;
  for (const Entry& e : h.entries) order.push_back(&e);
  MILES_RETURN_IF_ERROR(check_coverage(std::move(order), h, source));
  return h;
}

// A view when the bytes are aligned for the element type, else an aligned owned copy.
Tensor make_tensor(const Entry& e, const Header& h, const std::shared_ptr<const void>& owner) {
  const uint8_t* p = h.buffer + e.begin;
  if (reinterpret_cast<uintptr_t>(p) % dtype_size(e.dtype) == 0)
    return Tensor::view(e.dtype, e.shape, p, owner);
  Tensor t = Tensor::zeros(e.dtype, e.shape);
  std::memcpy(t.mutable_data<uint8_t>(), p, e.end - e.begin);
  return t;
}

}  // namespace

Result<TensorMap> parse_safetensors(const uint8_t* data, size_t size, const std::string& source,
                                    std::shared_ptr<const void> owner) {
  MILES_ASSIGN_OR_RETURN(Header h, parse_header(data, size, source));
  TensorMap map;
  for (const Entry& e : h.entries) map.insert(e.name, make_tensor(e, h, owner), source);
  return map;
}

Result<TensorMap> read_safetensors(const std::string& path) {
  MILES_ASSIGN_OR_RETURN(auto file, MappedFile::open(path));
  return parse_safetensors(file->data(), file->size(), path, file);
}

Result<std::map<std::string, std::string>> read_safetensors_metadata(const std::string& path) {
  MILES_ASSIGN_OR_RETURN(auto file, MappedFile::open(path));
  MILES_ASSIGN_OR_RETURN(Header h, parse_header(file->data(), file->size(), path));
  return std::move(h.metadata);
}

}  // namespace miles
