// The python reward: a function of the user's module called in this process by an embedded
// CPython (reward.h describes what it receives and returns).
//
// Why: practitioners write rewards in Python (slime's --custom-rm-path, verl's reward functions,
// math-verify); a function call in-process needs no server or JSON-lines protocol. One interpreter
// serves the process: started on the first python reward without its signal handlers (Ctrl-C stays
// ours), its GIL released between calls, never finalised (user modules may hold threads). Samples
// cross as the JSON objects the http and command kinds send; results come back as JSON too, so the
// C++ side touches no Python object but the function and the helper below.
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <cstdlib>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "controller/reward_internal.h"

namespace miles::reward {
namespace {

// The helper module: loads the function, scores a JSON batch, reports exceptions as tracebacks.
constexpr const char* kHelper = R"PY(
import asyncio, importlib, inspect, json, math, sys, traceback

MAX_ERROR = 4000

def load(spec, path):
    if path:
        sys.path.insert(0, path)
    module, _, name = spec.partition(':')
    obj = importlib.import_module(module)
    for part in name.split('.'):
        obj = getattr(obj, part)
    if not callable(obj):
        raise TypeError(f"{spec} is {type(obj).__name__}, not a function")
    return obj

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

// Holds the GIL for its scope (any thread).
class Gil {
 public:
  Gil() : state_(PyGILState_Ensure()) {}
  ~Gil() { PyGILState_Release(state_); }
  Gil(const Gil&) = delete;
  Gil& operator=(const Gil&) = delete;

 private:
  PyGILState_STATE state_;
};

// The pending Python exception as text ("Type: message"), cleared. GIL held.
std::string take_exception() {
  PyObject *type = nullptr, *value = nullptr, *trace = nullptr;
  PyErr_Fetch(&type, &value, &trace);
  PyErr_NormalizeException(&type, &value, &trace);
  std::string text = "unknown Python error";
  if (value) {
    PyObject* name = type ? PyObject_GetAttrString(type, "__name__") : nullptr;
    PyObject* str = PyObject_Str(value);
    const char* n = name ? PyUnicode_AsUTF8(name) : nullptr;
    const char* s = str ? PyUnicode_AsUTF8(str) : nullptr;
    text = std::string(n ? n : "Exception") + ": " + (s ? s : "");
    Py_XDECREF(name);
    Py_XDECREF(str);
  }
  PyErr_Clear();
  Py_XDECREF(type);
  Py_XDECREF(value);
  Py_XDECREF(trace);
  return text;
}

// The interpreter and the helper's functions, started once for the process.
struct Runtime {
  PyObject* load = nullptr;
  PyObject* score = nullptr;
  std::string error;  // why it could not start
};

// Without the interpreter's signal handlers; with the active virtualenv's packages (its python as
// the executable: the interpreter then reads its pyvenv.cfg); the working directory first on
// sys.path, as `python -m` does.
Status start_interpreter() {
  PyConfig config;
  PyConfig_InitPythonConfig(&config);
  config.install_signal_handlers = 0;
  config.parse_argv = 0;
  PyStatus st = PyStatus_Ok();
  if (const char* venv = std::getenv("VIRTUAL_ENV"); venv && *venv)
    st = PyConfig_SetBytesString(&config, &config.executable,
                                 (std::string(venv) + "/bin/python3").c_str());
  if (!PyStatus_Exception(st)) st = Py_InitializeFromConfig(&config);
  PyConfig_Clear(&config);
  if (PyStatus_Exception(st))
    return Status::Error(std::string("cannot start Python: ") + (st.err_msg ? st.err_msg : "?"));
  if (PyRun_SimpleString("import os, sys\nsys.path.insert(0, os.getcwd())\n") != 0)
    return Status::Error("cannot start Python: sys.path");
  return Status::Ok();
}

const Runtime& runtime() {
  static Runtime rt;
  static std::once_flag once;
  std::call_once(once, [] {
    if (Status s = start_interpreter(); !s.ok()) {
      rt.error = s.message();
      return;
    }
    PyObject* code = Py_CompileString(kHelper, "<miles reward helper>", Py_file_input);
    PyObject* module = code ? PyImport_ExecCodeModule("_miles_reward", code) : nullptr;
    Py_XDECREF(code);
    if (module) {
      rt.load = PyObject_GetAttrString(module, "load");
      rt.score = PyObject_GetAttrString(module, "score");
      Py_DECREF(module);
    }
    if (!rt.load || !rt.score) rt.error = "the reward helper failed: " + take_exception();
    PyEval_SaveThread();  // the GIL goes to whichever thread calls next
  });
  return rt;
}

class PythonScorer : public Scorer {
 public:
  PythonScorer(const Runtime& rt, PyObject* fn, std::string function)
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

  const Runtime& rt_;
  PyObject* fn_;  // a strong reference
  std::string function_;
};

}  // namespace

Result<std::unique_ptr<Scorer>> make_python_scorer(const RewardSpec& spec) {
  const Runtime& rt = runtime();
  if (!rt.error.empty()) return Status::Error(rt.error);
  Gil gil;
  PyObject* fn =
      PyObject_CallFunction(rt.load, "ss", spec.function.c_str(), spec.python_path.c_str());
  if (!fn)
    return Status::Error("reward '" + spec.name + "': cannot load function " + spec.function +
                         ": " + take_exception());
  return std::unique_ptr<Scorer>(new PythonScorer(rt, fn, spec.function));
}

}  // namespace miles::reward
