// The embedded CPython (python_embed.h).
#include "controller/python_embed.h"

#include <cstdlib>
#include <mutex>

namespace miles::controller::python {

namespace {

// Loads user functions by "module:name".
constexpr const char* kLoader = R"PY(
import importlib, sys

def load(spec, path):
    if path and path not in sys.path:
        sys.path.insert(0, path)
    module, _, name = spec.partition(':')
    obj = importlib.import_module(module)
    for part in name.split('.'):
        obj = getattr(obj, part)
    if not callable(obj):
        raise TypeError(f"{spec} is {type(obj).__name__}, not a function")
    return obj
)PY";

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

struct Runtime {
  Status status = Status::Ok();
  PyObject* load = nullptr;  // the loader's load(spec, path)
};

Runtime& runtime() {
  static Runtime rt;
  static std::once_flag once;
  std::call_once(once, [] {
    rt.status = start_interpreter();
    if (!rt.status.ok()) return;
    Result<PyObject*> loader = exec_module("_miles_loader", kLoader);
    if (loader.ok()) {
      rt.load = PyObject_GetAttrString(*loader, "load");
      Py_DECREF(*loader);
    }
    if (!rt.load)
      rt.status = Status::Error("the Python loader failed: " +
                                (loader.ok() ? take_exception() : loader.message()));
    PyEval_SaveThread();  // the GIL goes to whichever thread calls next
  });
  return rt;
}

}  // namespace

Status ensure_started() { return runtime().status; }

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

Result<PyObject*> exec_module(const char* name, const char* source) {
  const std::string file = std::string("<") + name + ">";
  PyObject* code = Py_CompileString(source, file.c_str(), Py_file_input);
  PyObject* module = code ? PyImport_ExecCodeModule(name, code) : nullptr;
  Py_XDECREF(code);
  if (!module) return Status::Error(std::string(name) + ": " + take_exception());
  return module;
}

Result<std::vector<PyObject*>> start_helper(const char* name, const char* source,
                                            std::initializer_list<const char*> names) {
  MILES_RETURN_IF_ERROR(ensure_started());
  Gil gil;
  MILES_ASSIGN_OR_RETURN(PyObject * module, exec_module(name, source));
  std::vector<PyObject*> out;
  for (const char* attr : names) {
    PyObject* obj = PyObject_GetAttrString(module, attr);
    if (!obj) {
      Py_DECREF(module);
      return Status::Error(std::string(name) + "." + attr + ": " + take_exception());
    }
    out.push_back(obj);
  }
  Py_DECREF(module);
  return out;
}

Result<PyObject*> load_function(const std::string& spec, const std::string& python_path) {
  const Runtime& rt = runtime();
  MILES_RETURN_IF_ERROR(rt.status);
  PyObject* fn = PyObject_CallFunction(rt.load, "ss", spec.c_str(), python_path.c_str());
  if (!fn) return Status::Error(take_exception());
  return fn;
}

Result<std::string> utf8_of(PyObject* text) {
  const char* utf8 = text ? PyUnicode_AsUTF8(text) : nullptr;
  if (!utf8) return Status::Error(take_exception());
  return std::string(utf8);
}

}  // namespace miles::controller::python
