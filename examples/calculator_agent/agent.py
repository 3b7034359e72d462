"""A multi-turn tool environment as a miles rollout function (rollout.function: "agent:run").

Each sample is a chat session: the model answers, and when its turn calls the calculator --
`calculator(EXPR)`, or an arithmetic expression followed by '=' -- the environment appends a tool
message with the result and the model goes on, up to rollout.max_turns turns. Every
`await client.chat(messages)` is one model turn of the sample's TITO session: miles plans it on the
session's exact token record, so the trainer consumes exactly the engines' tokens (tool messages
masked out), whatever this code does between turns.

The tool and the call finder are the same as miles' built-in `rollout.environment: calculator`
(controller/calculator.cc), so this function's run equals the built-in one bit for bit
(RlRun.CalculatorSessionsBuiltInAndInPythonTrainOnTheSameExactRecord); change them freely.

The function returns what the environment knows about the episode; a `kind: rollout` reward
scores its "reward" (here: 1 when the final answer is right and the tool was used correctly).
"""

import re

# An explicit call, or an equation the model writes out ("4 * 12 =").
CALL = re.compile(r"calculator\(([^()]*(?:\([^()]*\)[^()]*)*)\)", re.ASCII)
EQUATION = re.compile(
    r"(\(?-?\d+(?:\.\d+)?(?:\s*[-+*/x]\s*\(?-?\d+(?:\.\d+)?\)?)+)\s*=", re.ASCII)
NUMBER = re.compile(r"\d*(?:\.\d*)?", re.ASCII)
LAST_NUMBER = re.compile(r"-?\d+(?:\.\d+)?", re.ASCII)


class ArithmeticError_(ValueError):
    pass


class _Parser:
    """+ - * / (x for *), unary minus, parentheses; as the built-in calculator parses them."""

    def __init__(self, text):
        self.s, self.i = text, 0

    def fail(self, why):
        raise ArithmeticError_(f"{why} at position {self.i}")

    def skip(self):
        while self.i < len(self.s) and self.s[self.i] in " \t\n\v\f\r":
            self.i += 1

    def expr(self, depth):
        if depth > 64:
            self.fail("nesting too deep")
        v = self.term(depth)
        self.skip()
        while self.i < len(self.s) and self.s[self.i] in "+-":
            op = self.s[self.i]
            self.i += 1
            r = self.term(depth)
            v = v + r if op == "+" else v - r
            self.skip()
        return v

    def term(self, depth):
        v = self.factor(depth)
        self.skip()
        while self.i < len(self.s) and self.s[self.i] in "*/x":
            op = self.s[self.i]
            self.i += 1
            r = self.factor(depth)
            if op == "/" and r == 0:
                self.fail("division by zero")
            v = v / r if op == "/" else v * r
            self.skip()
        return v

    def factor(self, depth):
        self.skip()
        if self.i < len(self.s) and self.s[self.i] == "-":
            self.i += 1
            return -self.factor(depth + 1)
        if self.i < len(self.s) and self.s[self.i] == "(":
            self.i += 1
            v = self.expr(depth + 1)
            self.skip()
            if self.i >= len(self.s) or self.s[self.i] != ")":
                self.fail("missing ')'")
            self.i += 1
            return v
        start = self.i
        while self.i < len(self.s) and (self.s[self.i].isdigit() and self.s[self.i].isascii()
                                        or self.s[self.i] == "."):
            self.i += 1
        if start == self.i:
            self.fail("expected a number")
        prefix = NUMBER.match(self.s, start, self.i).group(0)  # the longest number it starts with
        if prefix in ("", "."):
            self.fail("bad number")
        return float(prefix)


def evaluate(expr):
    p = _Parser(expr)
    v = p.expr(0)
    p.skip()
    if p.i != len(expr):
        raise ArithmeticError_(f"unexpected '{expr[p.i]}' at position {p.i}")
    if v != v or v in (float("inf"), float("-inf")):
        raise ArithmeticError_("the result is not finite")
    return v


def find_call(text):
    m = CALL.search(text) or EQUATION.search(text)
    return m.group(1) if m else None


def calculator(expr):
    try:
        return f"{expr} = {'%.10g' % evaluate(expr)}"
    except ArithmeticError_ as e:
        return f"{expr}: error: {e}"


async def run(client, sample):
    messages = list(sample["messages"])
    tool_calls = tool_errors = 0
    reply = None
    max_turns = 3
    for _ in range(max_turns):
        try:
            reply = await client.chat(messages)
        except ValueError:
            # The tool message cannot extend the token record (e.g. the model ended its turn
            # with another stop token than the template's): the episode ends as it is.
            if reply is None:
                raise
            break
        if reply["finish_reason"] != "stop":  # a cut reply cannot be continued
            break
        call = find_call(reply["content"])
        if call is None:
            break
        result = calculator(call)
        tool_calls += 1
        tool_errors += ": error: " in result
        messages = reply["messages"] + [{"role": "tool", "content": result}]
    numbers = LAST_NUMBER.findall(reply["content"]) if reply else []
    right = bool(numbers) and sample["label"] is not None and \
        abs(float(numbers[-1]) - float(sample["label"])) == 0
    return {"reward": float(right and tool_errors == 0), "tool_calls": tool_calls,
            "tool_errors": tool_errors}
