// The values a Jinja template computes with, with Python's semantics.
//
// Why: chat templates are evaluated by Python's jinja2 over Python objects (dicts that keep
// insertion order, lists, tuples, str, int, float, bool, None, jinja2's Undefined, namespace()).
// Reproducing their output byte for byte needs the same distinctions (1 vs 1.0 vs True, tuple vs
// list, a missing key that is Undefined rather than an error), so Value mirrors those types instead
// of reusing nlohmann::json. Containers are shared (shared_ptr) because templates pass them around
// freely; the sandbox makes lists and dicts immutable, only namespace() objects are written to.
//
// Errors inside the interpreter are thrown as TemplateError and turned into a Status at the
// Template boundary (jinja.h); they never escape src/chat.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

namespace miles::jinja {

// A user error found while lexing, parsing or rendering. line 0: the interpreter fills in the line
// of the node it was evaluating.
struct TemplateError {
  std::string message;
  int line = 0;
};
[[noreturn]] void fail(std::string message, int line = 0);

class Value;
class Interp;

// Lists and dicts free their items without recursion (jinja_value.cc): a value nested a million
// levels deep (a namespace attribute wrapped in a list on every loop iteration) must not overflow
// the stack when it goes.
struct ListData {
  std::vector<Value> items;
  bool tuple = false;  // a Python tuple: printed "(a, b)", otherwise like a list
  ~ListData();
};

// Insertion-ordered string-keyed map (a Python dict; template dicts have string keys).
struct DictData {
  std::vector<std::pair<std::string, Value>> items;
  const Value* find(std::string_view key) const;
  void set(std::string key, Value value);  // replaces in place, or appends
  ~DictData();
};

// namespace(...): the one mutable object (`{% set ns.x = ... %}`).
struct NamespaceData {
  DictData attrs;
};

// Positional and keyword arguments of a call, filter or test (the subject is not in them).
struct Args {
  std::vector<Value> pos;
  std::vector<std::pair<std::string, Value>> kw;
  const Value* kwarg(std::string_view name) const;
};

struct Callable {
  std::string name;
  std::function<Value(Interp&, Args&)> fn;
  // A method's object (`x.items`): held here, not in `fn`, so that freeing it does not recurse.
  std::shared_ptr<const Value> bound;
};

struct Undefined {
  std::string hint;  // "'foo' is undefined", "'dict object' has no attribute 'x'"
};
struct None {};

class Value {
 public:
  using List = std::shared_ptr<ListData>;
  using Dict = std::shared_ptr<DictData>;
  using Namespace = std::shared_ptr<NamespaceData>;
  using Function = std::shared_ptr<Callable>;

  Value() : v_(Undefined{}) {}
  Value(None) : v_(None{}) {}                    // NOLINT
  Value(bool b) : v_(b) {}                       // NOLINT
  Value(int64_t i) : v_(i) {}                    // NOLINT
  Value(int i) : v_(static_cast<int64_t>(i)) {}  // NOLINT
  Value(double d) : v_(d) {}                     // NOLINT
  Value(std::string s) : v_(std::move(s)) {}     // NOLINT
  Value(const char* s) : v_(std::string(s)) {}   // NOLINT
  Value(List l) : v_(std::move(l)) {}            // NOLINT
  Value(Dict d) : v_(std::move(d)) {}            // NOLINT
  Value(Namespace n) : v_(std::move(n)) {}       // NOLINT
  Value(Function f) : v_(std::move(f)) {}        // NOLINT
  static Value undefined(std::string hint) { return Value(Undefined{std::move(hint)}); }
  static Value list(std::vector<Value> items, bool tuple = false);
  static Value dict();

  bool is_undefined() const { return std::holds_alternative<Undefined>(v_); }
  bool is_none() const { return std::holds_alternative<None>(v_); }
  bool is_bool() const { return std::holds_alternative<bool>(v_); }
  bool is_int() const { return std::holds_alternative<int64_t>(v_); }  // not bool
  bool is_float() const { return std::holds_alternative<double>(v_); }
  bool is_number() const { return is_bool() || is_int() || is_float(); }
  bool is_string() const { return std::holds_alternative<std::string>(v_); }
  bool is_list() const { return std::holds_alternative<List>(v_); }  // list or tuple
  bool is_dict() const { return std::holds_alternative<Dict>(v_); }
  bool is_namespace() const { return std::holds_alternative<Namespace>(v_); }
  bool is_callable() const { return std::holds_alternative<Function>(v_); }

  bool as_bool() const { return std::get<bool>(v_); }
  int64_t as_int() const { return std::get<int64_t>(v_); }
  double as_float() const { return std::get<double>(v_); }
  const std::string& as_string() const { return std::get<std::string>(v_); }
  const List& as_list() const { return std::get<List>(v_); }
  const Dict& as_dict() const { return std::get<Dict>(v_); }
  const Namespace& as_namespace() const { return std::get<Namespace>(v_); }
  const Function& as_callable() const { return std::get<Function>(v_); }
  const std::string& undefined_hint() const { return std::get<Undefined>(v_).hint; }

  // bool and int as int64 (Python: bool is an int); floats as double. note: call only on numbers.
  bool is_integral() const { return is_bool() || is_int(); }
  int64_t integral() const { return is_bool() ? (as_bool() ? 1 : 0) : as_int(); }
  double number() const { return is_float() ? as_float() : static_cast<double>(integral()); }

 private:
  explicit Value(Undefined u) : v_(std::move(u)) {}
  std::variant<Undefined, None, bool, int64_t, double, std::string, List, Dict, Namespace, Function>
      v_;
};

// Python's type name: "str", "int", "float", "bool", "NoneType", "list", "tuple", "dict", ...
std::string type_name(const Value& v);
bool truthy(const Value& v);
bool equals(const Value& a, const Value& b);  // Python ==
// Python <: numbers, strings (code point order), lists/tuples lexicographically; else TypeError.
bool less(const Value& a, const Value& b);
// Raises the UndefinedError an Undefined carries.
[[noreturn]] void fail_undefined(const Value& v);

// JSON -> Value (objects keep their key order) and back (tuples become arrays; Undefined,
// namespaces and callables are refused).
Value from_json(const nlohmann::ordered_json& j);
nlohmann::ordered_json to_json(const Value& v);

}  // namespace miles::jinja
