// GGUF reader: header, tensor infos and data bounds, all checked before use (metadata values:
// gguf_metadata.cc).
//
// Why: a GGUF file is untrusted input whose header states counts and lengths (of keys, strings,
// arrays, tensors) that a careless reader would allocate or index from. Layout (v2 and v3, little-
// endian): "GGUF", u32 version, u64 tensor_count, u64 kv_count; kv_count pairs (string key, u32
// value type, value); tensor_count infos (string name, u32 n_dims, u64 ne[n_dims], u32 ggml type,
// u64 offset); padding to `general.alignment` (default 32); the data section, tensor offsets
// relative to its start. A string is a u64 length and that many bytes; an array a u32 element type,
// a u64 count and the elements. Every count is compared with the bytes left before anything is
// allocated, so a lying header costs an error, not memory; errors name the file and the key or
// tensor.
#include <cstring>
#include <limits>
#include <set>

#include "checkpoint/gguf_cursor.h"
#include "checkpoint/gguf_dequant.h"
#include "checkpoint/mapped_file.h"

namespace miles {
namespace {

using gguf::Cursor;

constexpr uint32_t kDefaultAlignment = 32;
constexpr uint32_t kMaxDims = 4;

// Smallest encodings, used to bound counts by the bytes left: a key/value pair is a key length, a
// type and at least one value byte; a tensor info a name length, n_dims, one dim, a type and an
// offset.
constexpr uint64_t kMinKvBytes = 8 + 4 + 1;
constexpr uint64_t kMinTensorInfoBytes = 8 + 4 + 8 + 4 + 8;

struct Header {
  uint32_t version = 0;
  uint64_t tensor_count = 0;
  uint64_t kv_count = 0;
};

Result<Header> read_header(Cursor& c) {
  uint8_t magic[4];
  for (uint8_t& b : magic) MILES_RETURN_IF_ERROR(c.read(&b, "magic"));
  if (std::memcmp(magic, "GGUF", 4) != 0) return c.error("not a GGUF file (no 'GGUF' magic)");
  Header h;
  MILES_RETURN_IF_ERROR(c.read(&h.version, "version"));
  if (h.version != 2 && h.version != 3)
    return c.error("GGUF version " + std::to_string(h.version) +
                   " is not supported (2 and 3 are; a big-endian file reads as a huge version)");
  MILES_RETURN_IF_ERROR(c.read(&h.tensor_count, "tensor count"));
  MILES_RETURN_IF_ERROR(c.read(&h.kv_count, "metadata count"));
  MILES_RETURN_IF_ERROR(c.check_count(h.kv_count, kMinKvBytes, "metadata count"));
  return h;
}

Result<uint32_t> alignment_of(const std::map<std::string, GgufValue>& kv, const Cursor& c) {
  auto it = kv.find("general.alignment");
  if (it == kv.end()) return kDefaultAlignment;
  const GgufValue& v = it->second;
  if (v.type != GgufType::kU32)
    return c.error("metadata key 'general.alignment' is " + gguf::describe(v) + ", expected u32");
  if (v.i == 0 || (v.i & (v.i - 1)) != 0)
    return c.error("metadata key 'general.alignment' is " + std::to_string(v.i) +
                   ", not a power of two");
  return static_cast<uint32_t>(v.i);
}

// Reads one tensor info and computes its byte size from ne[] and the type's block geometry.
Status read_tensor_info(Cursor& c, GgufTensorInfo* t) {
  MILES_RETURN_IF_ERROR(c.read_string(&t->name, "tensor name"));
  c.set_context("tensor '" + t->name + "': ");
  uint32_t n_dims = 0;
  MILES_RETURN_IF_ERROR(c.read(&n_dims, "n_dims"));
  if (n_dims == 0 || n_dims > kMaxDims)
    return c.error("has " + std::to_string(n_dims) + " dimensions (1 to 4 allowed)");
  int64_t numel = 1;
  bool overflow = false;
  for (uint32_t d = 0; d < n_dims; ++d) {
    uint64_t ne = 0;
    MILES_RETURN_IF_ERROR(c.read(&ne, "dimension"));
    if (ne > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
      return c.error("dimension " + std::to_string(d) + " is " + std::to_string(ne) +
                     ", larger than 2^63 - 1");
    t->ne.push_back(static_cast<int64_t>(ne));
    overflow |= __builtin_mul_overflow(numel, static_cast<int64_t>(ne), &numel);
  }
  MILES_RETURN_IF_ERROR(c.read(&t->type, "ggml type"));
  MILES_RETURN_IF_ERROR(c.read(&t->offset, "data offset"));
  std::string shape;
  for (int64_t ne : t->ne) shape += (shape.empty() ? "" : ", ") + std::to_string(ne);
  if (overflow) return c.error("shape [" + shape + "] has more than 2^63 - 1 elements");
  const auto traits = gguf::ggml_type_traits(t->type);
  if (!traits) return c.error("has unknown ggml type " + std::to_string(t->type));
  if (t->ne[0] % traits->block_elems != 0)
    return c.error("has row length ne[0] = " + std::to_string(t->ne[0]) +
                   ", not a multiple of the " + std::to_string(traits->block_elems) +
                   "-element blocks of " + traits->name);
  const int64_t blocks = numel / traits->block_elems;
  int64_t nbytes = 0;
  if (__builtin_mul_overflow(blocks, traits->block_bytes, &nbytes))
    return c.error("shape [" + shape + "] of " + traits->name + " has a byte size over 2^63 - 1");
  t->nbytes = static_cast<uint64_t>(nbytes);
  c.set_context("");
  return Status::Ok();
}

// Places every tensor in the data section: aligned offset, [offset, offset + nbytes) inside the
// file.
Status locate_tensors(std::vector<GgufTensorInfo>& tensors, const uint8_t* data, size_t size,
                      uint64_t data_start, uint32_t alignment, const std::string& source) {
  for (GgufTensorInfo& t : tensors) {
    const std::string where = source + ": tensor '" + t.name + "' ";
    if (t.offset % alignment != 0)
      return Status::Error(where + "has data offset " + std::to_string(t.offset) +
                           ", not a multiple of the alignment " + std::to_string(alignment));
    const uint64_t room = size - data_start;  // data_start <= size is checked by the caller
    if (t.offset > room || t.nbytes > room - t.offset)
      return Status::Error(
          where + "has data [" + std::to_string(t.offset) + ", +" + std::to_string(t.nbytes) +
          ") past the end of the " + std::to_string(room) + "-byte data section (file " +
          std::to_string(size) + " bytes, data from byte " + std::to_string(data_start) + ")");
    t.data = data + data_start + t.offset;
  }
  return Status::Ok();
}

}  // namespace

Result<GgufFile> GgufFile::open(const std::string& path) {
  MILES_ASSIGN_OR_RETURN(auto file, MappedFile::open(path));
  const uint8_t* data = file->data();
  const size_t size = file->size();
  return parse(data, size, path, std::move(file));
}

Result<GgufFile> GgufFile::parse(const uint8_t* data, size_t size, const std::string& source,
                                 std::shared_ptr<const void> owner) {
  Cursor c(data, size, source);
  MILES_ASSIGN_OR_RETURN(Header h, read_header(c));
  GgufFile f;
  f.path_ = source;
  f.version_ = h.version;
  f.owner_ = std::move(owner);
  MILES_ASSIGN_OR_RETURN(f.kv_, gguf::read_metadata(c, h.kv_count));
  MILES_ASSIGN_OR_RETURN(const uint32_t alignment, alignment_of(f.kv_, c));
  MILES_RETURN_IF_ERROR(c.check_count(h.tensor_count, kMinTensorInfoBytes, "tensor count"));
  std::set<std::string> names;
  for (uint64_t k = 0; k < h.tensor_count; ++k) {
    GgufTensorInfo t;
    c.set_context("tensor info " + std::to_string(k) + ": ");
    MILES_RETURN_IF_ERROR(read_tensor_info(c, &t));
    if (!names.insert(t.name).second)
      return Status::Error(source + ": tensor '" + t.name + "' appears twice");
    f.tensors_.push_back(std::move(t));
  }
  if (f.tensors_.empty()) return f;  // nothing to place; the file may end without padding
  const uint64_t data_start = (c.pos() + alignment - 1) / alignment * alignment;
  if (data_start > size)
    return Status::Error(source + ": the data section would start at byte " +
                         std::to_string(data_start) + " (tensor infos end at " +
                         std::to_string(c.pos()) + ", alignment " + std::to_string(alignment) +
                         "), past the end of the " + std::to_string(size) + "-byte file");
  MILES_RETURN_IF_ERROR(locate_tensors(f.tensors_, data, size, data_start, alignment, source));
  return f;
}

const GgufValue* GgufFile::find(const std::string& key) const {
  auto it = kv_.find(key);
  return it == kv_.end() ? nullptr : &it->second;
}

const GgufTensorInfo* GgufFile::find_tensor(const std::string& name) const {
  for (const GgufTensorInfo& t : tensors_)
    if (t.name == name) return &t;
  return nullptr;
}

Result<Tensor> GgufFile::dequantize(const GgufTensorInfo& t) const {
  const auto traits = gguf::ggml_type_traits(t.type);
  MILES_CHECK(traits.has_value(), "tensor info with a type the parser should have refused");
  if (!traits->dequantizable)
    return Status::Error(
        path_ + ": tensor '" + t.name + "' has ggml type " + traits->name +
        ", which miles cannot dequantise (supported: " + gguf::dequantizable_type_names() + ")");
  std::vector<int64_t> shape(t.ne.rbegin(), t.ne.rend());
  Tensor out = Tensor::zeros(DType::kF32, std::move(shape));
  const int64_t blocks = static_cast<int64_t>(t.nbytes) / traits->block_bytes;
  MILES_CHECK(blocks * traits->block_elems == out.numel(), "tensor size and block count disagree");
  if (blocks > 0) gguf::dequantize_blocks(t.type, t.data, blocks, out.mutable_data<float>());
  return out;
}

}  // namespace miles
