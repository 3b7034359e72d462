// The rollout function (rollout_function.h): the Python client and the call into the host.
#include "controller/rollout_function.h"

#include <mutex>

#include "controller/python_embed.h"
#include "miles/json_text.h"

namespace miles::controller {

namespace {

// The client and the runner of one sample. `call(handle, op, request)` is the C function below.
constexpr const char* kHelper = R"PY(
import asyncio, inspect, json, traceback

MAX_ERROR = 4000

def check(fn, spec):
    if not inspect.iscoroutinefunction(fn) and not inspect.iscoroutinefunction(
            getattr(fn, '__call__', None)):
        raise TypeError(f"{spec} must be an async def function: async def fn(client, sample)")
    return fn

class Client:
    """One sample's way to the engines. Each chat() is one model turn of the sample's TITO
    session: the tokens the trainer consumes are the engines' own."""

    def __init__(self, call, handle, sample):
        self._call = call
        self._handle = handle
        self.sample = sample

    async def _op(self, op, request):
        reply = json.loads(
            await asyncio.to_thread(self._call, self._handle, op, json.dumps(request)))
        if 'rejected' in reply:
            raise ValueError(reply['rejected'])
        return reply

    async def chat(self, messages, *, tools=None, max_new_tokens=None, stop=None,
                   chat_template_kwargs=None):
        request = {'messages': list(messages)}
        if tools is not None:
            request['tools'] = list(tools)
        if max_new_tokens is not None:
            request['max_new_tokens'] = int(max_new_tokens)
        if stop is not None:
            request['stop'] = [stop] if isinstance(stop, str) else list(stop)
        if chat_template_kwargs is not None:
            request['chat_template_kwargs'] = dict(chat_template_kwargs)
        return await self._op('chat', request)

    async def generate(self, text=None, *, input_ids=None, max_new_tokens=None, stop=None):
        if (text is None) == (input_ids is None):
            raise TypeError('generate() takes a text or input_ids, not both')
        request = {'text': text} if text is not None else {'input_ids': list(input_ids)}
        if max_new_tokens is not None:
            request['max_new_tokens'] = int(max_new_tokens)
        if stop is not None:
            request['stop'] = [stop] if isinstance(stop, str) else list(stop)
        return await self._op('generate', request)

def _failure():
    text = traceback.format_exc()
    return text if len(text) <= MAX_ERROR else '...' + text[-MAX_ERROR:]

def run(fn, call, handle, sample_json):
    sample = json.loads(sample_json)
    try:
        result = asyncio.run(fn(Client(call, handle, dict(sample)), sample))
        return json.dumps({'result': result}, allow_nan=False)
    except BaseException:
        return json.dumps({'error': _failure()})
)PY";

using python::Gil;
using python::take_exception;

// _call(handle, op, request): the host's reply as JSON text, the GIL released meanwhile.
PyObject* call_host(PyObject*, PyObject* args) {
  PyObject* handle = nullptr;
  const char* op = nullptr;
  const char* request = nullptr;
  if (!PyArg_ParseTuple(args, "Oss", &handle, &op, &request)) return nullptr;
  auto* host = static_cast<RolloutHost*>(PyLong_AsVoidPtr(handle));
  if (!host) return nullptr;
  const std::string op_name(op);
  nlohmann::ordered_json parsed = parse_json_or_discarded<nlohmann::ordered_json>(request);
  Result<nlohmann::json> reply = Status::Error("the request is not JSON");
  Py_BEGIN_ALLOW_THREADS;
  if (!parsed.is_discarded()) reply = host->call(op_name, parsed);
  Py_END_ALLOW_THREADS;
  if (!reply.ok()) {
    PyErr_SetString(PyExc_RuntimeError, reply.message().c_str());
    return nullptr;
  }
  const std::string text = reply->dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  return PyUnicode_FromStringAndSize(text.data(), static_cast<Py_ssize_t>(text.size()));
}

PyMethodDef kCallDef = {"_call", call_host, METH_VARARGS, "one request of a rollout client"};

struct Helper {
  PyObject* check = nullptr;
  PyObject* run = nullptr;
  PyObject* call = nullptr;
  std::string error;
};

const Helper& helper() {
  static Helper h;
  static std::once_flag once;
  std::call_once(once, [] {
    auto attrs = python::start_helper("_miles_rollout", kHelper, {"check", "run"});
    if (!attrs.ok()) {
      h.error = "the rollout helper failed: " + attrs.message();
      return;
    }
    h.check = (*attrs)[0];
    h.run = (*attrs)[1];
    Gil gil;
    h.call = PyCFunction_New(&kCallDef, nullptr);
    if (!h.call) h.error = "the rollout helper failed: " + take_exception();
  });
  return h;
}

}  // namespace

Result<std::unique_ptr<RolloutFunction>> RolloutFunction::load(const std::string& function,
                                                               const std::string& python_path) {
  const Helper& h = helper();
  if (!h.error.empty()) return Status::Error(h.error);
  Gil gil;
  Result<PyObject*> fn = python::load_function(function, python_path);
  if (!fn.ok())
    return Status::Error("rollout.function: cannot load " + function + ": " + fn.message());
  PyObject* checked = PyObject_CallFunction(h.check, "Os", *fn, function.c_str());
  if (!checked) {
    Py_DECREF(*fn);
    return Status::Error("rollout.function: " + take_exception());
  }
  Py_DECREF(checked);
  return std::unique_ptr<RolloutFunction>(new RolloutFunction(*fn, function));
}

RolloutFunction::~RolloutFunction() {
  Gil gil;
  Py_DECREF(static_cast<PyObject*>(fn_));
}

RolloutOutcome RolloutFunction::run(const nlohmann::ordered_json& sample, RolloutHost& host) const {
  const Helper& h = helper();
  const std::string text =
      sample.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
  RolloutOutcome out;
  Result<std::string> reply = Status::Error("");
  {
    Gil gil;
    PyObject* handle = PyLong_FromVoidPtr(&host);
    PyObject* arg = PyUnicode_FromStringAndSize(text.data(), static_cast<Py_ssize_t>(text.size()));
    PyObject* r = handle && arg ? PyObject_CallFunctionObjArgs(h.run, static_cast<PyObject*>(fn_),
                                                               h.call, handle, arg, nullptr)
                                : nullptr;
    Py_XDECREF(handle);
    Py_XDECREF(arg);
    reply = python::utf8_of(r);
    Py_XDECREF(r);
  }
  if (!reply.ok()) {
    out.error = "rollout function " + function_ + ": " + reply.message();
    return out;
  }
  const nlohmann::json j = parse_json_or_discarded(*reply);
  if (j.is_discarded() || !j.is_object()) {
    out.error = "rollout function " + function_ + ": an unreadable reply";
  } else if (j.contains("error")) {
    out.error = "rollout function " + function_ + " failed:\n" + j["error"].get<std::string>();
  } else {
    out.result = j.value("result", nlohmann::json());
  }
  return out;
}

}  // namespace miles::controller
