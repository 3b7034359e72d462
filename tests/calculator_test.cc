// The calculator tool of the agentic environment: call finding and arithmetic.
#include "controller/calculator.h"

#include <gtest/gtest.h>

#include <random>
#include <regex>
#include <string>

namespace miles::controller {
namespace {

TEST(Calculator, FindsExplicitCallsAndEquations) {
  EXPECT_EQ(find_calculator_call("I will use calculator(17*23) now").value(), "17*23");
  EXPECT_EQ(find_calculator_call("calculator((2+3)*4)").value(), "(2+3)*4");
  EXPECT_EQ(find_calculator_call("So 4 * 12 = 48.").value(), "4 * 12");
  EXPECT_EQ(find_calculator_call("20 - 51 = ?").value(), "20 - 51");
  EXPECT_FALSE(find_calculator_call("The answer is 48.").has_value());
  EXPECT_FALSE(find_calculator_call("x = 3").has_value());
}

// The finder against the two patterns it implements, run by std::regex as an ECMAScript search
// (the reference: what the finder was before it became a linear scan), on random texts short
// enough for the regex's recursion, drawn from the pieces that matter.
TEST(Calculator, FindsWhatTheRegexesFound) {
  const std::regex call(R"(calculator\(([^()]*(?:\([^()]*\)[^()]*)*)\))");
  const std::regex equation(R"((\(?-?\d+(?:\.\d+)?(?:\s*[-+*/x]\s*\(?-?\d+(?:\.\d+)?\)?)+)\s*=)");
  int calls = 0, equations = 0;  // matches of each pattern drawn: both are exercised
  const auto reference = [&](const std::string& text) -> std::optional<std::string> {
    std::smatch m;
    if (std::regex_search(text, m, call)) return ++calls, m[1].str();
    if (std::regex_search(text, m, equation)) return ++equations, m[1].str();
    return std::nullopt;
  };
  const std::vector<std::string> pieces = {"calculator(", "(",  ")", "1", "23",   "4.5",
                                           ".",           "-",  "+", "*", "/",    "x",
                                           " ",           "\t", "=", "a", "calc", "\n"};
  // Equations are rare among those: every other text is drawn from arithmetic alone.
  const std::vector<std::string> arithmetic = {"1", "23", "4.5", ".", "-", "+", "*", "/",
                                               "x", " ",  "(",   ")", "=", "7", "8"};
  std::mt19937 rng(7);
  for (int n = 0; n < 50000; ++n) {
    const auto& from = n % 2 ? arithmetic : pieces;
    std::string text;
    const int len = 1 + static_cast<int>(rng() % 14);
    for (int i = 0; i < len; ++i) text += from[rng() % from.size()];
    ASSERT_EQ(find_calculator_call(text), reference(text)) << "'" << text << "'";
  }
  EXPECT_GT(calls, 1000);
  EXPECT_GT(equations, 400);
}

// A long reply: the regexes recursed once per character and overflowed an 8 MB stack at ~30 KB.
TEST(Calculator, LongRepliesAreScannedNotRecursed) {
  std::string sum;
  for (int i = 0; i < 200000; ++i) sum += "1+";
  EXPECT_EQ(find_calculator_call(sum + "1 = ?").value(), sum + "1");
  EXPECT_FALSE(find_calculator_call(sum + "1").has_value());
  const std::string long_arg(300000, 'a');
  EXPECT_EQ(find_calculator_call("calculator(" + long_arg + ")").value(), long_arg);
  EXPECT_FALSE(find_calculator_call("calculator(" + long_arg).has_value());
  std::string many;
  for (int i = 0; i < 50000; ++i) many += "calculator(";
  EXPECT_EQ(find_calculator_call(many + "2)").value(), "2");
}

TEST(Calculator, EvaluatesWithPrecedenceAndReportsErrors) {
  EXPECT_EQ(evaluate_arithmetic("2+3*4").value(), 14);
  EXPECT_EQ(evaluate_arithmetic("(2+3)*4").value(), 20);
  EXPECT_EQ(evaluate_arithmetic("-3 - -2").value(), -1);
  EXPECT_EQ(evaluate_arithmetic("7 x 6").value(), 42);
  EXPECT_EQ(evaluate_arithmetic("1.5/0.5").value(), 3);
  EXPECT_NE(evaluate_arithmetic("1/0").message().find("division by zero"), std::string::npos);
  EXPECT_NE(evaluate_arithmetic("(1+2").message().find("missing ')'"), std::string::npos);
  EXPECT_NE(evaluate_arithmetic("2+").message().find("expected a number"), std::string::npos);
  EXPECT_NE(evaluate_arithmetic("2 3").message().find("unexpected '3'"), std::string::npos);
  EXPECT_EQ(evaluate_arithmetic("1.2.3+1").message(), "bad number '1.2.3' at position 0");
  EXPECT_EQ(calculator_reply("4 * 12"), "4 * 12 = 48");
  EXPECT_EQ(calculator_reply("1/0"), "1/0: error: division by zero at position 3");
}

}  // namespace
}  // namespace miles::controller
