// The process's one embedded CPython, shared by the python reward (reward_python.cc) and the
// rollout function (rollout_python.cc). Include only from .cc files that link python3-embed.
//
// Why: one interpreter serves the process: started on first use without its signal handlers
// (Ctrl-C stays ours), with the active virtualenv's packages ($VIRTUAL_ENV: its python as the
// executable, so the interpreter reads its pyvenv.cfg) and the working directory first on
// sys.path (as `python -m` does); its GIL released between calls, never finalised (user modules
// may hold threads). User functions are loaded by "package.module:name" (slime's custom paths).
#pragma once

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <initializer_list>
#include <string>
#include <vector>

#include "miles/status.h"

namespace miles::controller::python {

// Holds the GIL for its scope (any thread). The interpreter must have started.
class Gil {
 public:
  Gil() : state_(PyGILState_Ensure()) {}
  ~Gil() { PyGILState_Release(state_); }
  Gil(const Gil&) = delete;
  Gil& operator=(const Gil&) = delete;

 private:
  PyGILState_STATE state_;
};

// Starts the interpreter once for the process; later calls return the first outcome.
Status ensure_started();

// The pending Python exception as text ("Type: message"), cleared. GIL held.
std::string take_exception();

// Runs `source` as a module named `name` and returns it (a new reference), or why not. GIL held.
Result<PyObject*> exec_module(const char* name, const char* source);

// A helper module of ours: starts the interpreter if need be, runs `source` as module `name`
// and returns its attributes `names`, in order (new references; kept for the process). Takes the
// GIL itself.
Result<std::vector<PyObject*>> start_helper(const char* name, const char* source,
                                            std::initializer_list<const char*> names);

// The callable `spec` ("package.module:name", dotted attributes allowed after the colon), imported
// with `python_path` (a directory, may be empty) first on sys.path: a new reference, or the
// Python error. GIL held.
Result<PyObject*> load_function(const std::string& spec, const std::string& python_path);

// The text of a str object (UTF-8), or the Python error. GIL held.
Result<std::string> utf8_of(PyObject* text);

}  // namespace miles::controller::python
