// Statement execution: output, if, for (with loop.*), set, macros, with, filter blocks.
#include <string>

#include "chat/jinja_interp.h"
#include "chat/jinja_limits.h"
#include "chat/jinja_print.h"

namespace miles::jinja {
namespace {

constexpr int kMaxCallDepth = 64;    // nested macro calls (templates recursing on themselves)
constexpr int kMaxEvalDepth = 2000;  // eval/exec recursion, about 1 MB of stack at most

}  // namespace

const Value* Frame::lookup(std::string_view name) const {
  for (const Frame* f = this; f; f = f->parent)
    for (const auto& [k, v] : f->vars)
      if (k == name) return &v;
  return nullptr;
}

void Frame::set(std::string_view name, Value value) {
  for (auto& [k, v] : vars) {
    if (k == name) {
      v = std::move(value);
      return;
    }
  }
  vars.emplace_back(std::string(name), std::move(value));
}

Interp::~Interp() {
  for (const Value::Namespace& ns : namespaces_) ns->attrs.items.clear();
}

void Interp::enter_call() {
  if (++call_depth_ > kMaxCallDepth)
    fail("macro calls nest too deeply (more than " + std::to_string(kMaxCallDepth) + ")");
}

std::string Interp::render(const Body& body) {
  std::string out;
  exec(body, root_, out);
  return out;
}

void Interp::bind_targets(const std::vector<std::string>& targets, const Value& item,
                          Frame& frame) {
  if (targets.size() == 1) {
    frame.set(targets[0], item);
    return;
  }
  const std::vector<Value> parts = iterate(item);
  if (parts.size() < targets.size())
    fail("not enough values to unpack (expected " + std::to_string(targets.size()) + ", got " +
         std::to_string(parts.size()) + ")");
  if (parts.size() > targets.size())
    fail("too many values to unpack (expected " + std::to_string(targets.size()) + ")");
  for (size_t i = 0; i < targets.size(); ++i) frame.set(targets[i], parts[i]);
}

void Interp::assign(const Stmt& s, Value value, Frame& frame) {
  if (!s.ns_attr) {
    bind_targets(s.targets, value, frame);
    return;
  }
  const Value* ns = frame.lookup(s.targets[0]);
  if (!ns || !ns->is_namespace())
    fail("cannot assign attribute '" + s.targets[1] + "' on '" + s.targets[0] +
         "': it is not a namespace() object");
  if (!s.targets[1].empty() && s.targets[1][0] == '_')
    fail("chat templates cannot store underscore-prefixed attributes on a namespace, but got '" +
         s.targets[1] + "'");
  ns->as_namespace()->attrs.set(s.targets[1], std::move(value));
}

Value Interp::make_macro(const Stmt& s) {
  auto fn = std::make_shared<Callable>();
  fn->name = s.name;
  const Stmt* stmt = &s;
  fn->fn = [stmt](Interp& in, Args& args) -> Value {
    const auto& params = stmt->targets;
    if (args.pos.size() > params.size())
      fail("macro '" + stmt->name + "' takes not more than " + std::to_string(params.size()) +
           " argument(s)");
    for (const auto& [k, v] : args.kw) {
      bool known = false;
      for (const auto& p : params) known = known || p == k;
      if (!known) fail("macro '" + stmt->name + "' takes no keyword argument '" + k + "'");
    }
    Frame mf(&in.root());
    for (size_t i = 0; i < params.size(); ++i) {
      if (i < args.pos.size()) {
        mf.set(params[i], args.pos[i]);
      } else if (const Value* kv = args.kwarg(params[i])) {
        mf.set(params[i], *kv);
      } else if (stmt->exprs[i]) {
        mf.set(params[i], in.eval(*stmt->exprs[i], mf));
      } else {
        mf.set(params[i], Value::undefined("parameter '" + params[i] + "' was not provided"));
      }
    }
    in.enter_call();
    std::string out;
    in.exec(stmt->bodies[0], mf, out);
    in.leave_call();
    return Value(std::move(out));
  };
  return Value(std::move(fn));
}

Flow Interp::exec_for(const Stmt& s, Frame& frame, std::string& out) {
  const Value iterable = eval(*s.expr, frame);
  line_ = s.line;
  std::vector<Value> items = iterate(iterable);
  if (s.cond) {
    std::vector<Value> kept;
    for (Value& item : items) {
      Frame f(&frame);
      bind_targets(s.targets, item, f);
      if (truthy(eval(*s.cond, f))) kept.push_back(std::move(item));
    }
    items = std::move(kept);
  }
  if (items.empty()) {
    Frame f(&frame);
    return exec(s.bodies[1], f, out);
  }
  const auto n = static_cast<int64_t>(items.size());
  for (int64_t i = 0; i < n; ++i) {
    spend_steps(6);  // besides its body's steps: an iteration builds `loop` (12 attributes)
    Frame f(&frame);
    bind_targets(s.targets, items[static_cast<size_t>(i)], f);
    Value loop = Value::dict();
    DictData& d = *loop.as_dict();
    d.items.reserve(12);
    d.items.emplace_back("index0", Value(i));
    d.items.emplace_back("index", Value(i + 1));
    d.items.emplace_back("revindex", Value(n - i));
    d.items.emplace_back("revindex0", Value(n - i - 1));
    d.items.emplace_back("first", Value(i == 0));
    d.items.emplace_back("last", Value(i == n - 1));
    d.items.emplace_back("length", Value(n));
    d.items.emplace_back("depth", Value(1));
    d.items.emplace_back("depth0", Value(0));
    d.items.emplace_back("previtem", i > 0 ? items[static_cast<size_t>(i - 1)]
                                           : Value::undefined("there is no previous item"));
    d.items.emplace_back("nextitem", i + 1 < n ? items[static_cast<size_t>(i + 1)]
                                               : Value::undefined("there is no next item"));
    auto cycle = std::make_shared<Callable>();
    cycle->name = "loop.cycle";
    cycle->fn = [i](Interp&, Args& args) -> Value {
      if (args.pos.empty()) fail("no items for cycling given");
      return args.pos[static_cast<size_t>(i) % args.pos.size()];
    };
    d.items.emplace_back("cycle", Value(std::move(cycle)));
    f.set("loop", std::move(loop));
    if (exec(s.bodies[0], f, out) == Flow::kBreak) break;
  }
  return Flow::kNormal;
}

Interp::DepthGuard::DepthGuard(Interp& in) : in(in) {
  spend_steps();
  if (++in.depth_ > kMaxEvalDepth) {
    --in.depth_;
    fail("the template nests too deeply while rendering");
  }
}

Flow Interp::exec(const Body& body, Frame& frame, std::string& out) {
  const DepthGuard guard(*this);
  for (const StmtPtr& sp : body) {
    const Stmt& s = *sp;
    line_ = s.line;
    switch (s.kind) {
      case StmtKind::kText:
        append_bounded(out, s.text);
        break;
      case StmtKind::kPrint:
        append_bounded(out, to_str(eval(*s.expr, frame)));
        break;
      case StmtKind::kIf: {
        size_t taken = s.exprs.size();
        for (size_t i = 0; i < s.exprs.size(); ++i) {
          if (truthy(eval(*s.exprs[i], frame))) {
            taken = i;
            break;
          }
        }
        if (taken < s.bodies.size()) {
          const Flow fl = exec(s.bodies[taken], frame, out);
          if (fl != Flow::kNormal) return fl;
        }
        break;
      }
      case StmtKind::kFor:
        exec_for(s, frame, out);
        break;
      case StmtKind::kSet:
        assign(s, eval(*s.expr, frame), frame);
        break;
      case StmtKind::kSetBlock:
      case StmtKind::kFilterBlock: {
        std::string captured;
        exec(s.bodies[0], frame, captured);
        Value v(std::move(captured));
        for (const ExprPtr& f : s.exprs) {
          Args args;
          eval_args(*f, 1, frame, args);
          line_ = f->line;
          v = f->filter(*this, v, args);
        }
        if (s.kind == StmtKind::kSetBlock) {
          frame.set(s.targets[0], std::move(v));
        } else {
          append_bounded(out, to_str(v));
        }
        break;
      }
      case StmtKind::kMacro:
        frame.set(s.name, make_macro(s));
        break;
      case StmtKind::kWith: {
        Frame f(&frame);
        for (size_t i = 0; i < s.targets.size(); ++i) f.set(s.targets[i], eval(*s.exprs[i], frame));
        const Flow fl = exec(s.bodies[0], f, out);
        if (fl != Flow::kNormal) return fl;
        break;
      }
      case StmtKind::kScope: {
        const Flow fl = exec(s.bodies[0], frame, out);
        if (fl != Flow::kNormal) return fl;
        break;
      }
      case StmtKind::kBreak:
        return Flow::kBreak;
      case StmtKind::kContinue:
        return Flow::kContinue;
    }
  }
  return Flow::kNormal;
}

}  // namespace miles::jinja
