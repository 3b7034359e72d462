// GGUF metadata: the key / value section of the file, and GgufFile's typed getters.
//
// Why: metadata holds the model's hyper-parameters and its whole tokenizer (tens of thousands of
// strings), so it is where a lying count or length would do the most harm. Each value is one of 13
// types; an array holds one element type (arrays of arrays are refused, as llama.cpp does); every
// array length is checked against the bytes left before the first element is read. Getters return
// errors naming the file and the key.
#include <limits>

#include "checkpoint/gguf_cursor.h"

namespace miles {
namespace gguf {
namespace {

bool is_valid_type(uint32_t t) { return t <= static_cast<uint32_t>(GgufType::kF64); }

// Bytes of one scalar of a metadata type (strings and arrays: 0, they have their own sizes).
uint64_t scalar_bytes(GgufType t) {
  switch (t) {
    case GgufType::kU8:
    case GgufType::kI8:
    case GgufType::kBool:
      return 1;
    case GgufType::kU16:
    case GgufType::kI16:
      return 2;
    case GgufType::kU32:
    case GgufType::kI32:
    case GgufType::kF32:
      return 4;
    case GgufType::kU64:
    case GgufType::kI64:
    case GgufType::kF64:
      return 8;
    default:
      return 0;
  }
}

bool is_integer(GgufType t) {
  return t != GgufType::kF32 && t != GgufType::kF64 && scalar_bytes(t) != 0;
}
bool is_float(GgufType t) { return t == GgufType::kF32 || t == GgufType::kF64; }

const char* type_name(GgufType t) {
  static const char* const kNames[] = {"u8",   "i8",     "u16",   "i16", "u32", "i32", "f32",
                                       "bool", "string", "array", "u64", "i64", "f64"};
  const auto i = static_cast<uint32_t>(t);
  return i < std::size(kNames) ? kNames[i] : "unknown";
}

}  // namespace

std::string describe(const GgufValue& v) {
  if (v.type != GgufType::kArray) return type_name(v.type);
  return std::string("array of ") + type_name(v.elem);
}

namespace {

// One scalar of an integer, bool or float type into `v` (i or f).
template <typename T>
Status read_int(Cursor& c, const char* what, int64_t* out) {
  T x;
  MILES_RETURN_IF_ERROR(c.read(&x, what));
  *out = static_cast<int64_t>(x);
  return Status::Ok();
}

Status read_scalar(Cursor& c, GgufType t, int64_t* i, double* f) {
  switch (t) {
    case GgufType::kU8:
      return read_int<uint8_t>(c, "u8 value", i);
    case GgufType::kI8:
      return read_int<int8_t>(c, "i8 value", i);
    case GgufType::kU16:
      return read_int<uint16_t>(c, "u16 value", i);
    case GgufType::kI16:
      return read_int<int16_t>(c, "i16 value", i);
    case GgufType::kU32:
      return read_int<uint32_t>(c, "u32 value", i);
    case GgufType::kI32:
      return read_int<int32_t>(c, "i32 value", i);
    case GgufType::kI64:
      return read_int<int64_t>(c, "i64 value", i);
    case GgufType::kU64: {
      uint64_t x;
      MILES_RETURN_IF_ERROR(c.read(&x, "u64 value"));
      if (x > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
        return c.error("u64 value " + std::to_string(x) + " is larger than 2^63 - 1");
      *i = static_cast<int64_t>(x);
      return Status::Ok();
    }
    case GgufType::kBool: {
      MILES_RETURN_IF_ERROR(read_int<uint8_t>(c, "bool value", i));
      if (*i > 1) return c.error("bool value is " + std::to_string(*i) + ", not 0 or 1");
      return Status::Ok();
    }
    case GgufType::kF32: {
      float x;
      MILES_RETURN_IF_ERROR(c.read(&x, "f32 value"));
      *f = x;
      return Status::Ok();
    }
    case GgufType::kF64:
      return c.read(f, "f64 value");
    default:
      MILES_CHECK(false, "read_scalar called for a string or array type");
  }
  return Status::Ok();
}

Status read_array(Cursor& c, GgufValue* v) {
  uint32_t elem = 0;
  MILES_RETURN_IF_ERROR(c.read(&elem, "array element type"));
  if (!is_valid_type(elem))
    return c.error("array has unknown element type " + std::to_string(elem));
  v->elem = static_cast<GgufType>(elem);
  if (v->elem == GgufType::kArray) return c.error("array of arrays is not supported");
  uint64_t n = 0;
  MILES_RETURN_IF_ERROR(c.read(&n, "array length"));
  const bool strings = v->elem == GgufType::kString;
  MILES_RETURN_IF_ERROR(c.check_count(n, strings ? 8 : scalar_bytes(v->elem), "array length"));
  for (uint64_t k = 0; k < n; ++k) {
    if (strings) {
      v->strings.emplace_back();
      MILES_RETURN_IF_ERROR(c.read_string(&v->strings.back(), "string element"));
    } else {
      int64_t i = 0;
      double f = 0;
      MILES_RETURN_IF_ERROR(read_scalar(c, v->elem, &i, &f));
      if (is_float(v->elem)) {
        v->floats.push_back(f);
      } else {
        v->ints.push_back(i);
      }
    }
  }
  return Status::Ok();
}

Status read_value(Cursor& c, GgufValue* v) {
  uint32_t type = 0;
  MILES_RETURN_IF_ERROR(c.read(&type, "value type"));
  if (!is_valid_type(type)) return c.error("has unknown value type " + std::to_string(type));
  v->type = static_cast<GgufType>(type);
  if (v->type == GgufType::kString) return c.read_string(&v->s, "string value");
  if (v->type == GgufType::kArray) return read_array(c, v);
  return read_scalar(c, v->type, &v->i, &v->f);
}

}  // namespace

Result<std::map<std::string, GgufValue>> read_metadata(Cursor& c, uint64_t count) {
  std::map<std::string, GgufValue> kv;
  for (uint64_t k = 0; k < count; ++k) {
    c.set_context("metadata entry " + std::to_string(k) + ": ");
    std::string key;
    MILES_RETURN_IF_ERROR(c.read_string(&key, "key"));
    if (key.empty()) return c.error("key is empty");
    c.set_context("metadata key '" + key + "': ");
    if (kv.count(key)) return c.error("appears twice");
    GgufValue v;
    MILES_RETURN_IF_ERROR(read_value(c, &v));
    kv.emplace(std::move(key), std::move(v));
  }
  c.set_context("");
  return kv;
}

}  // namespace gguf

namespace {

using gguf::describe;
using gguf::is_float;
using gguf::is_integer;

// The value at `key`, or an error naming the file and the key.
Result<const GgufValue*> lookup(const GgufFile& f, const std::string& key) {
  const GgufValue* v = f.find(key);
  if (!v) return Status::Error(f.path() + ": metadata key '" + key + "' is missing");
  return v;
}

Status wrong_type(const GgufFile& f, const std::string& key, const GgufValue& v,
                  const char* expected) {
  return Status::Error(f.path() + ": metadata key '" + key + "' is " + describe(v) + ", expected " +
                       expected);
}

}  // namespace

Result<std::string> GgufFile::get_string(const std::string& key) const {
  MILES_ASSIGN_OR_RETURN(const GgufValue* v, lookup(*this, key));
  if (v->type != GgufType::kString) return wrong_type(*this, key, *v, "a string");
  return v->s;
}

Result<int64_t> GgufFile::get_int(const std::string& key) const {
  MILES_ASSIGN_OR_RETURN(const GgufValue* v, lookup(*this, key));
  if (!is_integer(v->type) || v->type == GgufType::kBool)
    return wrong_type(*this, key, *v, "an integer");
  return v->i;
}

Result<bool> GgufFile::get_bool(const std::string& key) const {
  MILES_ASSIGN_OR_RETURN(const GgufValue* v, lookup(*this, key));
  if (v->type != GgufType::kBool) return wrong_type(*this, key, *v, "a bool");
  return v->i != 0;
}

Result<double> GgufFile::get_float(const std::string& key) const {
  MILES_ASSIGN_OR_RETURN(const GgufValue* v, lookup(*this, key));
  if (is_float(v->type)) return v->f;
  if (is_integer(v->type) && v->type != GgufType::kBool) return static_cast<double>(v->i);
  return wrong_type(*this, key, *v, "a number");
}

Result<std::vector<std::string>> GgufFile::get_strings(const std::string& key) const {
  MILES_ASSIGN_OR_RETURN(const GgufValue* v, lookup(*this, key));
  if (v->type != GgufType::kArray || v->elem != GgufType::kString)
    return wrong_type(*this, key, *v, "an array of strings");
  return v->strings;
}

Result<std::vector<double>> GgufFile::get_floats(const std::string& key) const {
  MILES_ASSIGN_OR_RETURN(const GgufValue* v, lookup(*this, key));
  if (v->type != GgufType::kArray || !(is_float(v->elem) || is_integer(v->elem)))
    return wrong_type(*this, key, *v, "an array of numbers");
  if (is_float(v->elem)) return v->floats;
  return std::vector<double>(v->ints.begin(), v->ints.end());
}

Result<std::vector<int64_t>> GgufFile::get_ints(const std::string& key) const {
  MILES_ASSIGN_OR_RETURN(const GgufValue* v, lookup(*this, key));
  if (v->type != GgufType::kArray || !is_integer(v->elem))
    return wrong_type(*this, key, *v, "an array of integers");
  return v->ints;
}

}  // namespace miles
