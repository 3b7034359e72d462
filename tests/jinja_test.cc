// The Jinja interpreter against Python's jinja2 (transformers' chat-template environment), feature
// by feature: tests/data/chat/jinja_cases.json holds templates, contexts and what jinja2 rendered
// or the error it raised (scripts/make_chat_goldens.py). Then the errors' line numbers, and
// robustness: the render limits against runaway templates, 64-bit edge cases.
#include "chat/jinja.h"

#include <gtest/gtest.h>

#include <atomic>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <thread>

#include "test_paths.h"

namespace miles::jinja {
namespace {

using ojson = nlohmann::ordered_json;

ojson load_cases() {
  std::ifstream in(test::data_dir() + "/chat/jinja_cases.json");
  EXPECT_TRUE(in) << "missing tests/data/chat/jinja_cases.json";
  std::stringstream ss;
  ss << in.rdbuf();
  return ojson::parse(ss.str());
}

Result<std::string> render(std::string_view src, const ojson& ctx = ojson::object()) {
  auto t = Template::parse(src, "t");
  if (!t.ok()) return t.status();
  return t->render(ctx);
}

TEST(Jinja, MatchesPythonJinja2OnEveryFeatureCase) {
  const ojson doc = load_cases();
  int rendered = 0, errors = 0;
  for (const ojson& c : doc["cases"]) {
    const std::string name = c["name"];
    SCOPED_TRACE(name);
    auto out = render(c["template"].get<std::string>(), c["context"]);
    if (c.contains("expected")) {
      ASSERT_TRUE(out.ok()) << out.message();
      EXPECT_EQ(out.value(), c["expected"].get<std::string>());
      ++rendered;
    } else {
      EXPECT_FALSE(out.ok()) << "Python raised " << c["error"] << " but we rendered "
                             << out.value();
      if (!out.ok()) {
        EXPECT_NE(out.message().find("template 't' line "), std::string::npos);
      }
      ++errors;
    }
  }
  EXPECT_GE(rendered, 80);
  EXPECT_GE(errors, 20);
}

void expect_error(std::string_view src, const std::string& fragment,
                  const ojson& ctx = ojson::object()) {
  auto out = render(src, ctx);
  ASSERT_FALSE(out.ok()) << "rendered: " << out.value();
  EXPECT_NE(out.message().find(fragment), std::string::npos) << out.message();
}

TEST(Jinja, ParseErrorsNameTheLine) {
  expect_error("a\nb\n{% if x %}\nnever closed",
               "line 4: unexpected end of template: the 'if' block opened on line 3");
  expect_error("a\n{{ x", "line 2: unexpected end of template: unclosed '{{'");
  expect_error("\n\n{# open", "line 3: missing end of comment tag");
  expect_error("x\ny\n{{ v | frobnicate }}", "line 3: unknown filter 'frobnicate'");
  expect_error("{{ v is frob }}", "line 1: unknown test 'frob'");
  expect_error("\n{% frobnicate %}", "line 2: unknown tag 'frobnicate'");
  expect_error("{% for x in y %}{% endif %}", "line 1: unexpected 'endif'");
  expect_error("{% include 'x.j2' %}", "the 'include' tag is not supported");
  expect_error("{% break %}", "'break' outside of a loop");
  expect_error("{{ 'unterminated }}", "unterminated string literal");
  expect_error("{{ a ! b }}", "unexpected char '!'");
  expect_error("{{ (1 + 2 }}", "unexpected '}', expected ')'");
  expect_error("{{ f(*args) }}", "not supported");
}

TEST(Jinja, RuntimeErrorsNameTheLine) {
  expect_error("ok\n{{ 'a' + 1 }}", "line 2: can only concatenate str (not \"int\") to str");
  expect_error("{% for m in ms %}\n{{ m.x.y }}{% endfor %}",
               "line 2: 'dict object' has no attribute 'x'",
               {{"ms", ojson::array({ojson::object()})}});
  expect_error("\n\n{{ raise_exception('Conversation roles must alternate') }}",
               "line 3: the template raised an exception: Conversation roles must alternate");
  expect_error("{{ nothing | tojson }}", "Object of type Undefined is not JSON serializable");
  expect_error("{{ l.append(1) }}", "unsafe", {{"l", ojson::array()}});
  expect_error("{{ 10 ** 100 }}", "integer overflow");
  expect_error("{{ 'x' * 10000000000 }}", "too large");
}

TEST(Jinja, RecursionAndNestingAreBounded) {
  expect_error("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}", "nest too deeply");
  expect_error("{{ " + std::string(500, '(') + "1" + std::string(500, ')') + " }}", "too deep");
  expect_error("{{ " + std::string(500, '[') + std::string(500, ']') + " }}", "too deep");
  expect_error("{{ " + std::string(5000, '-') + "1 }}", "too deep");
  std::string nested;
  for (int i = 0; i < 300; ++i) nested += "{% if true %}";
  expect_error(nested, "too deep");
}

// Templates that would hang a worker, exhaust its memory or overflow its stack fail with an error
// that names the limit (src/chat/jinja_limits.h). Found by tests/fuzz/fuzz_jinja.cc and by reading
// the interpreter: before the limits each of these timed out, ran out of memory, crashed or leaked.
TEST(Jinja, RunawayTemplatesStopAtTheRenderLimits) {
  // Steps: nested loops, a quadratic filter, printing a list that holds itself 2^40 times.
  expect_error("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
               "runs more than 1000000 steps");
  expect_error("{{ range(100000) | unique | list | length }}", "runs more than 1000000 steps");
  std::string dag = "{% set a = [1] %}";
  for (int i = 0; i < 40; ++i) dag += "{% set a = [a, a] %}";
  expect_error(dag + "{{ a }}", "runs more than 1000000 steps");
  // One value: widths and repetitions are refused before they are built.
  expect_error("{{ 'a' | center(10**12) }}", "too large");
  expect_error("{{ 'a\nb' | indent(10**12) }}", "too large");
  expect_error("{{ [1] | tojson(indent=10**12) }}", "too large");
  expect_error("{{ 'a'.rjust(10**12) }}", "too large");
  expect_error("{{ '%999999999d' % 1 }}", "too large");
  expect_error("{{ '%99999999999d' % 1 }}", "too large");  // the width overflowed an int (UB)
  expect_error("{{ '{:99999999999}'.format(1) }}", "too large");
  expect_error("{% set s = 'x' * 1000000 %}{{ ([s] * 100000) | length }}", "too large");
  expect_error("{% set s = 'x' * 100000 %}{{ s | replace('', s) }}", "too large");
  expect_error("{% set s = 'x' * 10000000 %}{% for i in range(100) %}{{ s }}{% endfor %}",
               "a string of more than 64 MiB is too large");
  // All values of a render together.
  expect_error(
      "{% set s = 'x' * 1000000 %}{% for i in range(1000) %}{% set t = s ~ i %}{% endfor %}",
      "builds more than 256 MiB of strings and lists");
  // Nesting: a namespace that holds itself prints with an error and is freed (no leak), and a
  // value nested 50000 deep in a loop is printed with an error and freed without recursion.
  expect_error("{% set ns = namespace(a=1) %}{% set ns.a = ns %}{{ ns }}",
               "nests more than 500 levels deep");
  auto cycle = render("{% set ns = namespace(a=1) %}{% set ns.a = [ns, ns] %}ok");
  ASSERT_TRUE(cycle.ok()) << cycle.message();
  EXPECT_EQ(cycle.value(), "ok");
  expect_error(
      "{% set ns = namespace(a=1) %}{% for i in range(50000) %}{% set ns.a = [ns.a] %}{% endfor %}"
      "{{ ns.a }}",
      "nests more than 500 levels deep");
  auto bound = render(
      "{% set ns = namespace(a=[]) %}{% for i in range(50000) %}{% set ns.a = [ns.a.count] %}"
      "{% endfor %}{{ ns.a | length }}");
  ASSERT_TRUE(bound.ok()) << bound.message();
  EXPECT_EQ(bound.value(), "1");
  expect_error("{{ x }}", "nests more than 500 levels deep",
               ojson{{"x", ojson::parse(std::string(600, '[') + std::string(600, ']'))}});
  // Far below the limits: a loop over jinja2's MAX_RANGE still renders.
  auto full = render("{% for i in range(100000) %}{% endfor %}done");
  ASSERT_TRUE(full.ok()) << full.message();
  EXPECT_EQ(full.value(), "done");
}

// 64-bit edge cases are errors or Python's answer, never undefined behaviour or an exception
// other than a TemplateError (found by tests/fuzz/fuzz_jinja.cc under UBSan).
TEST(Jinja, IntegerEdgesAreErrorsNotUndefinedBehaviour) {
  expect_error("{{ (-9223372036854775807 - 1) // -1 }}", "integer overflow");
  expect_error("{{ (-9223372036854775807 - 1) | abs }}", "integer overflow");
  expect_error("{{ 1e300 | int }}", "integer overflow");
  expect_error("{{ '%d' % 1e300 }}", "integer overflow");
  expect_error("{{ '{99999999999999999999999}'.format(1) }}",
               "Replacement index 99999999999999999999999 out of range");
  auto mod = render("{{ (-9223372036854775807 - 1) % -1 }}");
  ASSERT_TRUE(mod.ok()) << mod.message();
  EXPECT_EQ(mod.value(), "0");
  auto wide =
      render("{{ range(-9223372036854775807, 9223372036854775807, 4611686018427387904) | list }}");
  ASSERT_TRUE(wide.ok()) << wide.message();
  EXPECT_EQ(wide.value(), "[-9223372036854775807, -4611686018427387903, 1, 4611686018427387905]");
  auto attr = render("{{ [[1]] | map(attribute='99999999999999999999') | list | length }}");
  ASSERT_TRUE(attr.ok()) << attr.message();
  EXPECT_EQ(attr.value(), "1");
  auto fmt = render("{{ '%600d|%.3f' % (7, 2.5) }}");  // past the old 512-byte buffer
  ASSERT_TRUE(fmt.ok()) << fmt.message();
  EXPECT_EQ(fmt.value(), std::string(599, ' ') + "7|2.500");
}

TEST(Jinja, KeyOrderOfInputDictsIsKept) {
  const ojson ctx = ojson::parse(R"({"x": {"zeta": 1, "alpha": {"b": 2, "a": [3]}}})");
  auto out = render("{{ x | tojson }}|{% for k in x %}{{ k }}{% endfor %}", ctx);
  ASSERT_TRUE(out.ok()) << out.message();
  EXPECT_EQ(out.value(), R"({"zeta": 1, "alpha": {"b": 2, "a": [3]}}|zetaalpha)");
}

TEST(Jinja, ATemplateRendersConcurrently) {
  auto t = Template::parse("{% for i in range(n) %}{{ i }},{% endfor %}", "t");
  ASSERT_TRUE(t.ok());
  std::vector<std::thread> threads;
  std::atomic<int> bad{0};
  for (int k = 0; k < 4; ++k) {
    threads.emplace_back([&, k] {
      for (int r = 0; r < 200; ++r) {
        auto out = t->render(ojson{{"n", k + 1}});
        std::string want;
        for (int i = 0; i <= k; ++i) want += std::to_string(i) + ",";
        if (!out.ok() || out.value() != want) ++bad;
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(bad.load(), 0);
}

// Random byte soup built from template syntax must give a value or an error, never a crash.
TEST(Jinja, RandomTemplatesNeverCrash) {
  const char* pieces[] = {
      "{{",   "}}",        "{%",         "%}",       "{#",       "#}",     "-",     "+",
      " if ", " for ",     " in ",       " endif ",  " endfor ", " set ",  "=",     "x",
      "'s'",  "\"",        "(",          ")",        "[",        "]",      "{",     "}",
      "|",    " trim",     " is ",       " defined", ".",        ",",      ":",     "1",
      "2.5",  "\n",        " ",          "~",        "*",        "**",     "//",    "%",
      "loop", "ns",        "namespace(", "raw",      "endraw",   " else ", " not ", "\\",
      "é",    "macro m()", "endmacro"};
  std::mt19937 rng(1234);
  int ok = 0;
  for (int i = 0; i < 3000; ++i) {
    std::string src;
    const int n = 1 + static_cast<int>(rng() % 24);
    for (int k = 0; k < n; ++k) src += pieces[rng() % (sizeof(pieces) / sizeof(pieces[0]))];
    auto out = render(src, ojson{{"x", ojson::array({1, "a"})}});
    ok += out.ok();
  }
  EXPECT_GT(ok, 0);
}

}  // namespace
}  // namespace miles::jinja
