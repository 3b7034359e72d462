// Jinja's built-in tests (`x is defined`, `x is string`, ...), as jinja2/tests.py defines them.
#include <map>
#include <string>

#include "chat/jinja_interp.h"
#include "chat/jinja_limits.h"
#include "chat/jinja_print.h"
#include "chat/py_text.h"

namespace miles::jinja {
namespace {

const Value& one_arg(std::string_view test, const Args& args) {
  const auto a = bind_args(test, args, {"other"});
  if (!a[0]) fail("test '" + std::string(test) + "' needs an argument");
  return *a[0];
}

void no_args(std::string_view test, const Args& args) { bind_args(test, args, {}); }

bool t_defined(Interp&, const Value& v, Args& a) {
  no_args("defined", a);
  return !v.is_undefined();
}
bool t_undefined(Interp&, const Value& v, Args& a) {
  no_args("undefined", a);
  return v.is_undefined();
}
bool t_none(Interp&, const Value& v, Args& a) {
  no_args("none", a);
  return v.is_none();
}
bool t_boolean(Interp&, const Value& v, Args& a) {
  no_args("boolean", a);
  return v.is_bool();
}
bool t_true(Interp&, const Value& v, Args& a) {
  no_args("true", a);
  return v.is_bool() && v.as_bool();
}
bool t_false(Interp&, const Value& v, Args& a) {
  no_args("false", a);
  return v.is_bool() && !v.as_bool();
}
bool t_integer(Interp&, const Value& v, Args& a) {
  no_args("integer", a);
  return v.is_int();
}
bool t_float(Interp&, const Value& v, Args& a) {
  no_args("float", a);
  return v.is_float();
}
bool t_number(Interp&, const Value& v, Args& a) {
  no_args("number", a);
  return v.is_number();
}
bool t_string(Interp&, const Value& v, Args& a) {
  no_args("string", a);
  return v.is_string();
}
bool t_mapping(Interp&, const Value& v, Args& a) {
  no_args("mapping", a);
  return v.is_dict();
}
// Undefined iterates as empty and has __len__/__getitem__ in jinja2, so it passes both.
bool t_iterable(Interp&, const Value& v, Args& a) {
  no_args("iterable", a);
  return v.is_string() || v.is_list() || v.is_dict() || v.is_undefined();
}
bool t_sequence(Interp&, const Value& v, Args& a) {
  no_args("sequence", a);
  return v.is_string() || v.is_list() || v.is_dict() || v.is_undefined();
}
bool t_callable(Interp&, const Value& v, Args& a) {
  no_args("callable", a);
  return v.is_callable();
}
bool t_sameas(Interp&, const Value& v, Args& a) {
  const Value& o = one_arg("sameas", a);
  if (v.is_none() || o.is_none()) return v.is_none() && o.is_none();
  if (v.is_bool() && o.is_bool()) return v.as_bool() == o.as_bool();
  if (v.is_list() && o.is_list()) return v.as_list() == o.as_list();
  if (v.is_dict() && o.is_dict()) return v.as_dict() == o.as_dict();
  if (v.is_namespace() && o.is_namespace()) return v.as_namespace() == o.as_namespace();
  if (v.is_callable() && o.is_callable()) return v.as_callable() == o.as_callable();
  return false;
}
int64_t int_value(const Value& v, const char* test) {
  if (!v.is_number()) fail(std::string("test '") + test + "' needs a number, not " + type_name(v));
  if (v.is_float()) fail(std::string("test '") + test + "' on a float is not supported");
  return v.integral();
}
bool t_even(Interp&, const Value& v, Args& a) {
  no_args("even", a);
  return int_value(v, "even") % 2 == 0;
}
bool t_odd(Interp&, const Value& v, Args& a) {
  no_args("odd", a);
  return int_value(v, "odd") % 2 != 0;
}
bool t_divisibleby(Interp&, const Value& v, Args& a) {
  const int64_t d = int_value(one_arg("divisibleby", a), "divisibleby");
  if (d == 0) fail("integer division or modulo by zero");
  return int_value(v, "divisibleby") % d == 0;
}
bool t_eq(Interp&, const Value& v, Args& a) { return equals(v, one_arg("eq", a)); }
bool t_ne(Interp&, const Value& v, Args& a) { return !equals(v, one_arg("ne", a)); }
bool t_lt(Interp&, const Value& v, Args& a) { return less(v, one_arg("lt", a)); }
bool t_gt(Interp&, const Value& v, Args& a) { return less(one_arg("gt", a), v); }
bool t_le(Interp&, const Value& v, Args& a) {
  const Value& o = one_arg("le", a);
  return less(v, o) || equals(v, o);
}
bool t_ge(Interp&, const Value& v, Args& a) {
  const Value& o = one_arg("ge", a);
  return less(o, v) || equals(v, o);
}
bool t_in(Interp& in, const Value& v, Args& a) { return in.contains(one_arg("in", a), v); }
bool has_cased(const std::string& s) {
  for (size_t i = 0; i < s.size();)
    if (py::is_cased(py::next_cp(s, i))) return true;
  return false;
}
bool t_lower(Interp&, const Value& v, Args& a) {
  no_args("lower", a);
  const std::string s = to_str(v);
  return has_cased(s) && py::lower(s) == s;
}
bool t_upper(Interp&, const Value& v, Args& a) {
  no_args("upper", a);
  const std::string s = to_str(v);
  return has_cased(s) && py::upper(s) == s;
}
bool t_escaped(Interp&, const Value&, Args& a) {
  no_args("escaped", a);
  return false;
}
bool t_filter(Interp&, const Value& v, Args& a) {
  no_args("filter", a);
  return v.is_string() && find_filter(v.as_string()) != nullptr;
}
bool t_test(Interp&, const Value& v, Args& a) {
  no_args("test", a);
  return v.is_string() && find_test(v.as_string()) != nullptr;
}

const std::map<std::string, TestFn, std::less<>>& tests() {
  static const std::map<std::string, TestFn, std::less<>> table = {
      {"!=", t_ne},
      {"<", t_lt},
      {"<=", t_le},
      {"==", t_eq},
      {">", t_gt},
      {">=", t_ge},
      {"boolean", t_boolean},
      {"callable", t_callable},
      {"defined", t_defined},
      {"divisibleby", t_divisibleby},
      {"eq", t_eq},
      {"equalto", t_eq},
      {"escaped", t_escaped},
      {"even", t_even},
      {"false", t_false},
      {"filter", t_filter},
      {"float", t_float},
      {"ge", t_ge},
      {"greaterthan", t_gt},
      {"gt", t_gt},
      {"in", t_in},
      {"integer", t_integer},
      {"iterable", t_iterable},
      {"le", t_le},
      {"lessthan", t_lt},
      {"lower", t_lower},
      {"lt", t_lt},
      {"mapping", t_mapping},
      {"ne", t_ne},
      {"none", t_none},
      {"number", t_number},
      {"odd", t_odd},
      {"sameas", t_sameas},
      {"sequence", t_sequence},
      {"string", t_string},
      {"test", t_test},
      {"true", t_true},
      {"undefined", t_undefined},
      {"upper", t_upper},
  };
  return table;
}

}  // namespace

TestFn find_test(std::string_view name) {
  const auto& t = tests();
  const auto it = t.find(name);
  return it == t.end() ? nullptr : it->second;
}

bool apply_test(Interp& in, std::string_view name, const Value& v, Args& args) {
  spend_steps();  // select('...') calls it once per item
  const TestFn t = find_test(name);
  if (!t) fail("unknown test '" + std::string(name) + "'");
  return t(in, v, args);
}

}  // namespace miles::jinja
