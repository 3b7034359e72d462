// Global functions of transformers' chat-template environment: jinja2's range, dict, namespace,
// joiner, plus transformers' raise_exception and strftime_now.
#include <ctime>
#include <map>
#include <string>

#include "chat/jinja_interp.h"
#include "chat/jinja_print.h"

namespace miles::jinja {
namespace {

constexpr int64_t kMaxRange = 100000;  // jinja2.sandbox.MAX_RANGE

Value g_range(Interp&, Args& args) {
  if (!args.kw.empty()) fail("range() takes no keyword arguments");
  if (args.pos.empty() || args.pos.size() > 3)
    fail("range expected 1 to 3 arguments, got " + std::to_string(args.pos.size()));
  for (const Value& v : args.pos)
    if (!v.is_integral()) fail("'" + type_name(v) + "' object cannot be interpreted as an integer");
  int64_t start = 0, stop, step = 1;
  if (args.pos.size() == 1) {
    stop = args.pos[0].integral();
  } else {
    start = args.pos[0].integral();
    stop = args.pos[1].integral();
    if (args.pos.size() == 3) step = args.pos[2].integral();
  }
  if (step == 0) fail("range() arg 3 must not be zero");
  const __int128 lo = start, hi = stop, by = step;  // no overflow for any 64-bit arguments
  const __int128 n =
      by > 0 ? (hi > lo ? (hi - lo + by - 1) / by : 0) : (lo > hi ? (lo - hi - by - 1) / -by : 0);
  if (n > kMaxRange)
    fail("Range too big. The sandbox blocks ranges larger than MAX_RANGE (100000).");
  std::vector<Value> items;
  items.reserve(static_cast<size_t>(n));
  for (int64_t k = 0; k < n; ++k) items.emplace_back(static_cast<int64_t>(lo + k * by));
  return Value::list(std::move(items));
}

// dict(*args, **kwargs) as Python builds it: a mapping (or nothing), then the keywords.
Value dict_from(Args& args, const char* fn) {
  if (args.pos.size() > 1) fail(std::string(fn) + " expected at most 1 positional argument");
  Value d = Value::dict();
  if (!args.pos.empty()) {
    const Value& m = args.pos[0];
    if (m.is_dict()) {
      d.as_dict()->items = m.as_dict()->items;
    } else if (m.is_namespace()) {
      d.as_dict()->items = m.as_namespace()->attrs.items;
    } else {
      fail(std::string(fn) + " needs a mapping, not " + type_name(m));
    }
  }
  for (const auto& [k, v] : args.kw) d.as_dict()->set(k, v);
  return d;
}

Value g_dict(Interp&, Args& args) { return dict_from(args, "dict()"); }

Value g_namespace(Interp& in, Args& args) {
  const Value d = dict_from(args, "namespace()");
  auto ns = std::make_shared<NamespaceData>();
  in.adopt(ns);
  for (const auto& [k, v] : d.as_dict()->items) {
    if (!k.empty() && k[0] == '_')
      fail("chat templates cannot store underscore-prefixed attributes on a namespace, but got '" +
           k + "'");
    ns->attrs.set(k, v);
  }
  return Value(std::move(ns));
}

Value g_raise_exception(Interp&, Args& args) {
  const auto a = bind_args("raise_exception", args, {"message"});
  fail("the template raised an exception: " + (a[0] ? to_str(*a[0]) : std::string()));
}

Value g_strftime_now(Interp&, Args& args) {
  const auto a = bind_args("strftime_now", args, {"format"});
  const std::string fmt = a[0] ? to_str(*a[0]) : std::string();
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  localtime_r(&now, &tm);
  char buf[512];
  const size_t n = std::strftime(buf, sizeof(buf), fmt.c_str(), &tm);
  return Value(std::string(buf, n));
}

Value g_joiner(Interp&, Args& args) {
  const auto a = bind_args("joiner", args, {"sep"});
  auto used = std::make_shared<bool>(false);
  auto fn = std::make_shared<Callable>();
  fn->name = "joiner";
  fn->fn = [sep = a[0] ? to_str(*a[0]) : std::string(", "), used](Interp&, Args&) -> Value {
    if (!*used) {
      *used = true;
      return Value(std::string());
    }
    return Value(sep);
  };
  return Value(std::move(fn));
}

Value make(const char* name, Value (*f)(Interp&, Args&)) {
  auto fn = std::make_shared<Callable>();
  fn->name = name;
  fn->fn = f;
  return Value(std::move(fn));
}

}  // namespace

Value lookup_global(std::string_view name) {
  static const std::map<std::string, Value, std::less<>> globals = {
      {"range", make("range", g_range)},
      {"dict", make("dict", g_dict)},
      {"namespace", make("namespace", g_namespace)},
      {"joiner", make("joiner", g_joiner)},
      {"raise_exception", make("raise_exception", g_raise_exception)},
      {"strftime_now", make("strftime_now", g_strftime_now)},
  };
  const auto it = globals.find(name);
  return it == globals.end() ? Value::undefined("'" + std::string(name) + "' is undefined")
                             : it->second;
}

}  // namespace miles::jinja
