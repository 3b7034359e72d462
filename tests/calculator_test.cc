// The calculator tool of the agentic environment: call finding and arithmetic.
#include "controller/calculator.h"

#include <gtest/gtest.h>

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
  EXPECT_EQ(calculator_reply("4 * 12"), "4 * 12 = 48");
  EXPECT_EQ(calculator_reply("1/0"), "1/0: error: division by zero at position 3");
}

}  // namespace
}  // namespace miles::controller
