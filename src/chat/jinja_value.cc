// Python semantics of template values: truthiness, ==, <, type names, JSON conversion; freeing
// nested containers without recursion.
#include "chat/jinja_value.h"

#include <cmath>
#include <limits>

#include "chat/jinja_limits.h"

namespace miles::jinja {

void fail(std::string message, int line) { throw TemplateError{std::move(message), line}; }

namespace {

bool is_container(const Value& v) {
  return v.is_list() || v.is_dict() || v.is_namespace() || v.is_callable();
}

// Moves the containers among `items` onto `stack`, and drops the rest.
void take_nested(std::vector<Value>& items, std::vector<Value>& stack) {
  for (Value& v : items)
    if (is_container(v)) stack.push_back(std::move(v));
  items.clear();
}
void take_nested(std::vector<std::pair<std::string, Value>>& items, std::vector<Value>& stack) {
  for (auto& kv : items)
    if (is_container(kv.second)) stack.push_back(std::move(kv.second));
  items.clear();
}

// Frees the containers on `stack` one after another: a container that dies here hands its own
// containers to the stack first, so no destructor ever frees a nested one itself.
void free_iteratively(std::vector<Value>& stack) {
  while (!stack.empty()) {
    Value v = std::move(stack.back());
    stack.pop_back();
    if (v.is_list() && v.as_list().use_count() == 1) {
      take_nested(v.as_list()->items, stack);
    } else if (v.is_dict() && v.as_dict().use_count() == 1) {
      take_nested(v.as_dict()->items, stack);
    } else if (v.is_namespace() && v.as_namespace().use_count() == 1) {
      take_nested(v.as_namespace()->attrs.items, stack);
    } else if (v.is_callable() && v.as_callable().use_count() == 1 && v.as_callable()->bound &&
               v.as_callable()->bound.use_count() == 1) {
      if (is_container(*v.as_callable()->bound)) stack.push_back(*v.as_callable()->bound);
      v.as_callable()->bound.reset();
    }
  }
}

}  // namespace

ListData::~ListData() {
  std::vector<Value> stack;
  take_nested(items, stack);
  free_iteratively(stack);
}

DictData::~DictData() {
  std::vector<Value> stack;
  take_nested(items, stack);
  free_iteratively(stack);
}

const Value* DictData::find(std::string_view key) const {
  for (const auto& [k, v] : items)
    if (k == key) return &v;
  return nullptr;
}

void DictData::set(std::string key, Value value) {
  for (auto& [k, v] : items) {
    if (k == key) {
      v = std::move(value);
      return;
    }
  }
  items.emplace_back(std::move(key), std::move(value));
}

const Value* Args::kwarg(std::string_view name) const {
  for (const auto& [k, v] : kw)
    if (k == name) return &v;
  return nullptr;
}

Value Value::list(std::vector<Value> items, bool tuple) {
  spend_bytes(copy_bytes(items));
  auto l = std::make_shared<ListData>();
  l->items = std::move(items);
  l->tuple = tuple;
  return Value(std::move(l));
}

Value Value::dict() { return Value(std::make_shared<DictData>()); }

std::string type_name(const Value& v) {
  if (v.is_undefined()) return "Undefined";
  if (v.is_none()) return "NoneType";
  if (v.is_bool()) return "bool";
  if (v.is_int()) return "int";
  if (v.is_float()) return "float";
  if (v.is_string()) return "str";
  if (v.is_list()) return v.as_list()->tuple ? "tuple" : "list";
  if (v.is_dict()) return "dict";
  if (v.is_namespace()) return "Namespace";
  return "function";
}

bool truthy(const Value& v) {
  if (v.is_undefined() || v.is_none()) return false;
  if (v.is_bool()) return v.as_bool();
  if (v.is_int()) return v.as_int() != 0;
  if (v.is_float()) return v.as_float() != 0.0;
  if (v.is_string()) return !v.as_string().empty();
  if (v.is_list()) return !v.as_list()->items.empty();
  if (v.is_dict()) return !v.as_dict()->items.empty();
  return true;
}

bool equals(const Value& a, const Value& b) {
  const NestingGuard nest;
  spend_steps();
  if (a.is_undefined() || b.is_undefined()) return a.is_undefined() && b.is_undefined();
  if (a.is_none() || b.is_none()) return a.is_none() && b.is_none();
  if (a.is_number() && b.is_number()) {
    if (a.is_integral() && b.is_integral()) return a.integral() == b.integral();
    return a.number() == b.number();
  }
  if (a.is_string() && b.is_string()) return a.as_string() == b.as_string();
  if (a.is_list() && b.is_list()) {
    const ListData& x = *a.as_list();
    const ListData& y = *b.as_list();
    if (x.tuple != y.tuple || x.items.size() != y.items.size()) return false;
    for (size_t i = 0; i < x.items.size(); ++i)
      if (!equals(x.items[i], y.items[i])) return false;
    return true;
  }
  if (a.is_dict() && b.is_dict()) {
    const DictData& x = *a.as_dict();
    const DictData& y = *b.as_dict();
    if (x.items.size() != y.items.size()) return false;
    for (const auto& [k, v] : x.items) {
      const Value* w = y.find(k);
      if (!w || !equals(v, *w)) return false;
    }
    return true;
  }
  if (a.is_namespace() && b.is_namespace()) return a.as_namespace() == b.as_namespace();
  if (a.is_callable() && b.is_callable()) return a.as_callable() == b.as_callable();
  return false;
}

bool less(const Value& a, const Value& b) {
  const NestingGuard nest;
  spend_steps();
  if (a.is_number() && b.is_number()) {
    if (a.is_integral() && b.is_integral()) return a.integral() < b.integral();
    return a.number() < b.number();
  }
  if (a.is_string() && b.is_string()) return a.as_string() < b.as_string();  // UTF-8 = code points
  if (a.is_list() && b.is_list() && a.as_list()->tuple == b.as_list()->tuple) {
    const auto& x = a.as_list()->items;
    const auto& y = b.as_list()->items;
    for (size_t i = 0; i < x.size() && i < y.size(); ++i) {
      if (equals(x[i], y[i])) continue;
      return less(x[i], y[i]);
    }
    return x.size() < y.size();
  }
  if (a.is_undefined()) fail_undefined(a);
  if (b.is_undefined()) fail_undefined(b);
  fail("'<' not supported between instances of '" + type_name(a) + "' and '" + type_name(b) + "'");
}

void fail_undefined(const Value& v) { fail(v.undefined_hint()); }

Value from_json(const nlohmann::ordered_json& j) {
  const NestingGuard nest;
  using T = nlohmann::ordered_json::value_t;
  switch (j.type()) {
    case T::null:
      return Value(None{});
    case T::boolean:
      return Value(j.get<bool>());
    case T::number_integer:
      return Value(j.get<int64_t>());
    case T::number_unsigned: {
      const uint64_t u = j.get<uint64_t>();
      if (u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
        fail("integer " + std::to_string(u) + " is too large (64-bit signed integers only)");
      return Value(static_cast<int64_t>(u));
    }
    case T::number_float:
      return Value(j.get<double>());
    case T::string:
      return Value(j.get<std::string>());
    case T::array: {
      std::vector<Value> items;
      items.reserve(j.size());
      for (const auto& e : j) items.push_back(from_json(e));
      return Value::list(std::move(items));
    }
    case T::object: {
      Value d = Value::dict();
      auto& items = d.as_dict()->items;
      items.reserve(j.size());
      for (const auto& [k, e] : j.items()) items.emplace_back(k, from_json(e));
      return d;
    }
    default:
      fail("unsupported JSON value (binary or discarded)");
  }
}

nlohmann::ordered_json to_json(const Value& v) {
  const NestingGuard nest;
  if (v.is_none()) return nullptr;
  if (v.is_bool()) return v.as_bool();
  if (v.is_int()) return v.as_int();
  if (v.is_float()) return v.as_float();
  if (v.is_string()) return v.as_string();
  if (v.is_list()) {
    nlohmann::ordered_json a = nlohmann::ordered_json::array();
    for (const Value& e : v.as_list()->items) a.push_back(to_json(e));
    return a;
  }
  if (v.is_dict()) {
    nlohmann::ordered_json o = nlohmann::ordered_json::object();
    for (const auto& [k, e] : v.as_dict()->items) o[k] = to_json(e);
    return o;
  }
  fail("Object of type " + type_name(v) + " is not JSON serializable");
}

}  // namespace miles::jinja
