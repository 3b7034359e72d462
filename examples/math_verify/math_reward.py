"""A math reward for `miles run` with math-verify (PyPI: math-verify), Hugging Face's verifier.

    rewards:
      - kind: python
        function: "math_reward:score"
        python_path: examples/math_verify

The engine's response is parsed for its final answer (LaTeX such as \\boxed{42} or \\frac{1}{2},
or a plain expression such as -31 or 0.5) and compared with the data row's label by value, so
"\\frac{1}{2}", "0.5" and "1/2" all match a label of 0.5. math-verify is imported from the active
virtualenv: run `miles run` with VIRTUAL_ENV set (scripts/setup.sh installs it into MILES_VENV).

miles calls rewards from its rollout threads, and math-verify's own timeouts use signal.alarm,
which works in a main thread only: they are off here (parsing_timeout / timeout_seconds None). A
grader that can hang needs its own bound, or the command kind (its timeout_s kills the process).
"""
import logging

from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse, verify

# It warns on every call that its timeouts are off; they are off on purpose (see above).
logging.getLogger("math_verify").setLevel(logging.ERROR)

_GOLD = [ExprExtractionConfig()]
_ANSWER = [LatexExtractionConfig(), ExprExtractionConfig()]


def score(sample):
    """1.0 when the response's answer equals the label (a number or an expression), else 0.0."""
    gold = parse(str(sample["label"]), extraction_config=_GOLD, parsing_timeout=None)
    answer = parse(sample["response"], extraction_config=_ANSWER, parsing_timeout=None)
    if not gold or not answer:
        return 0.0
    return 1.0 if verify(gold, answer, timeout_seconds=None) else 0.0
