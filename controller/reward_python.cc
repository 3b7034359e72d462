// The python reward: a function of the user's module called in this process by an embedded
// CPython (reward.h describes what it receives and returns).
//
// Why: practitioners write rewards in Python (slime's --custom-rm-path, verl's reward functions,
// math-verify); a function call in-process needs no server or JSON-lines protocol. The interpreter
// is the process's one (python_embed.h). Samples cross as the JSON objects the http and command
// kinds send; results come back as JSON too, so the C++ side touches no Python object but the
// function and the helper below.
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "controller/python_embed.h"
#include "controller/reward_internal.h"

namespace miles::reward {
namespace {

namespace python = controller::python;

// The helper module: scores a JSON batch, reports exceptions as tracebacks.
constexpr const char* kHelper = R"PY(
import asyncio, inspect, json, math, traceback

MAX_ERROR = 4000

def _number(value):
    if isinstance(value, dict):
        if 'score' not in value:
            raise TypeError("returned a dict without 'score'")
        value = value['score']
    if isinstance(value, bool):
        value = float(value)
    if not isinstance(value, (int, float)):
        raise TypeError(f"returned {type(value).__name__}, not a number")
    value = float(value)
    if not math.isfinite(value):
        raise ValueError(f"returned {value}, not a finite number")
    return value

def _failure():
    text = traceback.format_exc()
    return text if len(text) <= MAX_ERROR else '...' + text[-MAX_ERROR:]

def _call(fn, sample):
    try:
        result = fn(sample)
        if inspect.isawaitable(result):
            result = asyncio.run(result)
        return [_number(result), '']
    except BaseException:
        return [0.0, _failure()]

async def _gather(fn, samples):
    async def one(sample):
        try:
            return [_number(await fn(sample)), '']
        except BaseException:
            return [0.0, _failure()]
    return await asyncio.gather(*(one(s) for s in samples))

def score(fn, batch_json):
    samples = json.loads(batch_json)
    if inspect.iscoroutinefunction(fn):
        try:
            results = asyncio.run(_gather(fn, samples))
        except BaseException:
            results = [[0.0, _failure()]] * len(samples)
    else:
        results = [_call(fn, s) for s in samples]
    return json.dumps(results)
)PY";

using python::Gil;
using python::take_exception;

// The helper's score(batch_fn, batch), started once for the process.
struct Helper {
  PyObject* score = nullptr;
  std::string error;  // why it could not start
};

const Helper& helper() {
  static Helper h;
  static std::once_flag once;
  std::call_once(once, [] {
    auto attrs = python::start_helper("_miles_reward", kHelper, {"score"});
    if (attrs.ok())
      h.score = (*attrs)[0];
    else
      h.error = "the reward helper failed: " + attrs.message();
  });
  return h;
}

class PythonScorer : public Scorer {
 public:
  PythonScorer(const Helper& rt, PyObject* fn, std::string function)
      : rt_(rt), fn_(fn), function_(std::move(function)) {}
  ~PythonScorer() override {
    Gil gil;
    Py_DECREF(fn_);
  }

  std::vector<Result<double>> score(std::span<const RewardInput> inputs) override {
    std::string batch = "[";
    for (const RewardInput& in : inputs) batch += (batch.size() > 1 ? "," : "") + request_json(in);
    batch += "]";
    Result<std::string> reply = call(batch);
    std::vector<Result<double>> out;
    out.reserve(inputs.size());
    if (!reply.ok()) {
      for (size_t i = 0; i < inputs.size(); ++i) out.push_back(reply.status());
      return out;
    }
    const nlohmann::json results = nlohmann::json::parse(*reply);
    for (const nlohmann::json& r : results) {
      const std::string error = r[1].get<std::string>();
      if (error.empty()) {
        out.push_back(r[0].get<double>());
      } else {
        out.push_back(Status::Error("python reward " + function_ + " failed:\n" + error));
      }
    }
    return out;
  }

 private:
  // The helper's score(fn, batch): its JSON reply, or why the call itself failed.
  Result<std::string> call(const std::string& batch) {
    Gil gil;
    PyObject* text =
        PyUnicode_DecodeUTF8(batch.data(), static_cast<Py_ssize_t>(batch.size()), "replace");
    PyObject* reply = text ? PyObject_CallFunctionObjArgs(rt_.score, fn_, text, nullptr) : nullptr;
    Py_XDECREF(text);
    const char* utf8 = reply ? PyUnicode_AsUTF8(reply) : nullptr;
    if (!utf8) {
      Py_XDECREF(reply);
      return Status::Error("python reward " + function_ + ": " + take_exception());
    }
    std::string out(utf8);
    Py_DECREF(reply);
    return out;
  }

  const Helper& rt_;
  PyObject* fn_;  // a strong reference
  std::string function_;
};

}  // namespace

Result<std::unique_ptr<Scorer>> make_python_scorer(const RewardSpec& spec) {
  const Helper& h = helper();
  if (!h.error.empty()) return Status::Error(h.error);
  Gil gil;
  Result<PyObject*> fn = python::load_function(spec.function, spec.python_path);
  if (!fn.ok())
    return Status::Error("reward '" + spec.name + "': cannot load function " + spec.function +
                         ": " + fn.message());
  return std::unique_ptr<Scorer>(new PythonScorer(h, *fn, spec.function));
}

}  // namespace miles::reward
