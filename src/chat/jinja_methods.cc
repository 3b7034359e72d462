// Methods templates call on values: str (startswith, split, strip, ...), list and dict (items,
// get, ...), with Python's semantics on code points. Mutating methods (list.append, dict.update)
// are refused, as transformers' ImmutableSandboxedEnvironment refuses them.
#include <algorithm>
#include <string>

#include "chat/jinja_interp.h"
#include "chat/jinja_limits.h"
#include "chat/jinja_print.h"
#include "chat/py_text.h"

namespace miles::jinja {
namespace {

constexpr std::string_view kStrMethods[] = {
    "capitalize", "center",   "count",   "endswith",     "find",         "format",     "index",
    "isalnum",    "isalpha",  "isdigit", "islower",      "isspace",      "isupper",    "join",
    "ljust",      "lower",    "lstrip",  "removeprefix", "removesuffix", "replace",    "rfind",
    "rindex",     "rjust",    "rsplit",  "rstrip",       "split",        "splitlines", "startswith",
    "strip",      "swapcase", "title",   "upper",        "zfill"};
constexpr std::string_view kListMethods[] = {"count", "index", "copy"};
constexpr std::string_view kListMutators[] = {"append", "clear",  "extend",  "insert",
                                              "pop",    "remove", "reverse", "sort"};
constexpr std::string_view kDictMethods[] = {"copy", "get", "items", "keys", "values"};
constexpr std::string_view kDictMutators[] = {"clear", "pop", "popitem", "setdefault", "update"};

template <size_t N>
bool in_set(const std::string_view (&set)[N], std::string_view name) {
  return std::find(std::begin(set), std::end(set), name) != std::end(set);
}

std::optional<std::string> opt_str(const Value* v, const char* what) {
  if (!v || v->is_none()) return std::nullopt;
  if (!v->is_string()) fail(std::string(what) + " must be str or None, not " + type_name(*v));
  return v->as_string();
}

const std::string& need_str(const Value* v, const char* what) {
  if (!v) fail(std::string(what) + " is required");
  if (!v->is_string()) fail(std::string(what) + " must be str, not " + type_name(*v));
  return v->as_string();
}

int64_t opt_int(const Value* v, int64_t dflt) {
  if (!v || v->is_none()) return dflt;
  if (!v->is_integral()) fail("an integer is required, not " + type_name(*v));
  return v->integral();
}

bool all_cps(const std::string& s, bool (*pred)(char32_t)) {
  if (s.empty()) return false;
  for (size_t i = 0; i < s.size();)
    if (!pred(py::next_cp(s, i))) return false;
  return true;
}

// startswith / endswith with a str or a tuple of str.
bool affix_match(const std::string& s, const Value& arg, bool prefix, const char* fn) {
  auto one = [&](const Value& v) {
    if (!v.is_string())
      fail(std::string(fn) + " first arg must be str or a tuple of str, not " + type_name(v));
    const std::string& a = v.as_string();
    if (a.size() > s.size()) return false;
    return prefix ? s.compare(0, a.size(), a) == 0
                  : s.compare(s.size() - a.size(), a.size(), a) == 0;
  };
  if (arg.is_list()) {
    for (const Value& v : arg.as_list()->items)
      if (one(v)) return true;
    return false;
  }
  return one(arg);
}

std::string justify(const std::string& s, int64_t width, const Value* fill, char align) {
  std::string f = " ";
  if (fill) {
    f = need_str(fill, "fill character");
    if (py::cp_len(f) != 1) fail("The fill character must be exactly one character long");
  }
  const auto n = static_cast<int64_t>(py::cp_len(s));
  if (n >= width) return s;
  const int64_t total = width - n;
  uint64_t size = 0;
  spend_bytes(__builtin_mul_overflow(static_cast<uint64_t>(total), f.size(), &size) ? UINT64_MAX
                                                                                    : size);
  const int64_t left = align == '<' ? 0 : align == '>' ? total : total / 2 + (total & width & 1);
  std::string out;
  for (int64_t k = 0; k < left; ++k) out += f;
  out += s;
  for (int64_t k = 0; k < total - left; ++k) out += f;
  return out;
}

// How many parts s.split(sep, maxsplit) gives, counted before they are built.
uint64_t split_parts(const std::string& s, const std::optional<std::string>& sep,
                     int64_t maxsplit) {
  uint64_t n = 0;
  if (sep) {
    n = static_cast<uint64_t>(py::count(s, *sep)) + 1;
  } else {
    bool in_word = false;
    for (size_t i = 0; i < s.size();) {
      const bool space = py::is_space(py::next_cp(s, i));
      n += !space && !in_word;
      in_word = !space;
    }
  }
  return maxsplit < 0 ? n : std::min(n, static_cast<uint64_t>(maxsplit) + 1);
}

// The parts of `s` as a list, counted against the render's limits before they are built.
void spend_parts(const std::string& s, uint64_t parts) {
  spend_bytes(parts * (sizeof(Value) + sizeof(std::string)) + s.size());
}

Value str_list(std::vector<std::string> parts) {
  std::vector<Value> items;
  items.reserve(parts.size());
  for (auto& p : parts) items.emplace_back(std::move(p));
  return Value::list(std::move(items));
}

Value call_str_method(Interp& in, const std::string& s, std::string_view m, Args& args) {
  if (m == "startswith" || m == "endswith") {
    const auto a = bind_args(m, args, {"prefix"});
    if (!a[0]) fail(std::string(m) + "() takes at least 1 argument");
    return Value(
        affix_match(s, *a[0], m == "startswith", m == "startswith" ? "startswith" : "endswith"));
  }
  if (m == "strip" || m == "lstrip" || m == "rstrip") {
    const auto a = bind_args(m, args, {"chars"});
    return Value(py::strip(s, opt_str(a[0], "chars"), m != "rstrip", m != "lstrip"));
  }
  if (m == "split" || m == "rsplit") {
    const auto a = bind_args(m, args, {"sep", "maxsplit"});
    const auto sep = opt_str(a[0], "sep");
    if (sep && sep->empty()) fail("empty separator");
    spend_parts(s, split_parts(s, sep, opt_int(a[1], -1)));
    return str_list(py::split(s, sep, opt_int(a[1], -1), m == "rsplit"));
  }
  if (m == "splitlines") {
    const auto a = bind_args(m, args, {"keepends"});
    uint64_t breaks = 1;
    for (size_t i = 0; i < s.size();) breaks += py::is_linebreak(py::next_cp(s, i));
    spend_parts(s, breaks);
    return str_list(py::splitlines(s, a[0] && truthy(*a[0])));
  }
  if (m == "upper" || m == "lower" || m == "title" || m == "capitalize" || m == "swapcase") {
    bind_args(m, args, {});
    if (m == "upper") return Value(py::upper(s));
    if (m == "lower") return Value(py::lower(s));
    if (m == "title") return Value(py::title(s));
    if (m == "capitalize") return Value(py::capitalize(s));
    std::string out;
    for (size_t i = 0; i < s.size();) {
      const char32_t c = py::next_cp(s, i);
      py::append_utf8(out, py::to_lower(c) != c ? py::to_lower(c) : py::to_upper(c));
    }
    return Value(std::move(out));
  }
  if (m == "replace") {
    const auto a = bind_args(m, args, {"old", "new", "count"});
    return Value(
        replace_bounded(s, need_str(a[0], "old"), need_str(a[1], "new"), opt_int(a[2], -1)));
  }
  if (m == "find" || m == "rfind" || m == "index" || m == "rindex") {
    const auto a = bind_args(m, args, {"sub"});
    const int64_t r = py::find(s, need_str(a[0], "sub"), m == "rfind" || m == "rindex");
    if (r < 0 && (m == "index" || m == "rindex")) fail("substring not found");
    return Value(r);
  }
  if (m == "count") {
    const auto a = bind_args(m, args, {"sub"});
    return Value(py::count(s, need_str(a[0], "sub")));
  }
  if (m == "join") {
    const auto a = bind_args(m, args, {"iterable"});
    if (!a[0]) fail("join() takes exactly one argument");
    std::string out;
    bool first = true;
    for (const Value& v : in.iterate(*a[0])) {
      if (!v.is_string()) fail("sequence item: expected str instance, " + type_name(v) + " found");
      if (!first) append_bounded(out, s);
      first = false;
      append_bounded(out, v.as_string());
    }
    return Value(std::move(out));
  }
  if (m == "format") return Value(str_format(s, args));
  if (m == "isdigit") return Value(all_cps(s, py::is_digit));
  if (m == "isalpha") return Value(all_cps(s, py::is_alpha));
  if (m == "isalnum")
    return Value(all_cps(s, [](char32_t c) { return py::is_alpha(c) || py::is_digit(c); }));
  if (m == "isspace") return Value(all_cps(s, py::is_space));
  if (m == "islower" || m == "isupper") {
    bool cased = false;
    for (size_t i = 0; i < s.size();) {
      const char32_t c = py::next_cp(s, i);
      if (!py::is_cased(c)) continue;
      cased = true;
      if (m == "islower" ? py::to_lower(c) != c : py::to_upper(c) != c) return Value(false);
    }
    return Value(cased);
  }
  if (m == "center" || m == "ljust" || m == "rjust") {
    const auto a = bind_args(m, args, {"width", "fillchar"});
    return Value(justify(s, opt_int(a[0], 0), a[1], m == "ljust" ? '<' : m == "rjust" ? '>' : '^'));
  }
  if (m == "zfill") {
    const auto a = bind_args(m, args, {"width"});
    const int64_t width = opt_int(a[0], 0);
    const auto n = static_cast<int64_t>(py::cp_len(s));
    if (n >= width) return Value(s);
    spend_bytes(static_cast<uint64_t>(width - n) + s.size());
    const bool sign = !s.empty() && (s[0] == '+' || s[0] == '-');
    return Value((sign ? s.substr(0, 1) : "") + std::string(static_cast<size_t>(width - n), '0') +
                 s.substr(sign ? 1 : 0));
  }
  if (m == "removeprefix" || m == "removesuffix") {
    const auto a = bind_args(m, args, {"affix"});
    const std::string& x = need_str(a[0], "affix");
    if (m == "removeprefix") return Value(s.compare(0, x.size(), x) == 0 ? s.substr(x.size()) : s);
    if (x.size() <= s.size() && s.compare(s.size() - x.size(), x.size(), x) == 0)
      return Value(s.substr(0, s.size() - x.size()));
    return Value(s);
  }
  fail("'str' object has no method '" + std::string(m) + "'");
}

Value call_list_method(const Value& obj, std::string_view m, Args& args) {
  const auto& items = obj.as_list()->items;
  if (m == "copy") {
    bind_args(m, args, {});
    return Value::list(items, obj.as_list()->tuple);
  }
  const auto a = bind_args(m, args, {"value"});
  if (!a[0]) fail(std::string(m) + "() takes exactly one argument");
  if (m == "count")
    return Value(static_cast<int64_t>(std::count_if(
        items.begin(), items.end(), [&](const Value& v) { return equals(v, *a[0]); })));
  for (size_t i = 0; i < items.size(); ++i)
    if (equals(items[i], *a[0])) return Value(static_cast<int64_t>(i));
  fail(repr(*a[0]) + " is not in list");
}

Value call_dict_method(const Value& obj, std::string_view m, Args& args) {
  const DictData& d = *obj.as_dict();
  if (m == "get") {
    const auto a = bind_args(m, args, {"key", "default"});
    if (!a[0]) fail("get expected at least 1 argument, got 0");
    const Value* v = a[0]->is_string() ? d.find(a[0]->as_string()) : nullptr;
    return v ? *v : (a[1] ? *a[1] : Value(None{}));
  }
  bind_args(m, args, {});
  if (m == "copy") {
    Value c = Value::dict();
    c.as_dict()->items = d.items;
    return c;
  }
  std::vector<Value> out;
  for (const auto& [k, v] : d.items) {
    if (m == "keys") {
      out.emplace_back(k);
    } else if (m == "values") {
      out.push_back(v);
    } else {
      out.push_back(Value::list({Value(k), v}, true));
    }
  }
  return Value::list(std::move(out));
}

}  // namespace

std::string replace_bounded(const std::string& s, const std::string& from, const std::string& to,
                            int64_t count) {
  auto n = static_cast<uint64_t>(py::count(s, from));  // occurrences (code points + 1 for "")
  if (count >= 0) n = std::min(n, static_cast<uint64_t>(count));
  uint64_t added = 0;
  if (to.size() > from.size() && __builtin_mul_overflow(n, to.size() - from.size(), &added))
    added = UINT64_MAX - s.size();
  spend_bytes(s.size() + added);
  return py::replace(s, from, to, count);
}

bool has_method(const Value& obj, std::string_view name) {
  if (obj.is_string()) return in_set(kStrMethods, name);
  if (obj.is_list()) return in_set(kListMethods, name);
  if (obj.is_dict()) return in_set(kDictMethods, name);
  return false;
}

bool is_mutator(const Value& obj, std::string_view name) {
  return (obj.is_list() && in_set(kListMutators, name)) ||
         (obj.is_dict() && in_set(kDictMutators, name));
}

Value call_method(Interp& in, const Value& obj, std::string_view name, Args& args) {
  if (obj.is_string()) return call_str_method(in, obj.as_string(), name, args);
  if (obj.is_list()) return call_list_method(obj, name, args);
  if (obj.is_dict()) return call_dict_method(obj, name, args);
  fail("'" + type_name(obj) + "' object has no method '" + std::string(name) + "'");
}

}  // namespace miles::jinja
