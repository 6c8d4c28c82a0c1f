// The evaluator: statements write into a string, expressions give Values.
// Scopes follow jinja2's: the template's top level, one scope per loop
// iteration (a `set` inside a loop body does not outlive the iteration), one
// per macro call; `if` opens none. A scope is freed when its iteration or call
// ends, unless a macro defined in it may still be called. Every node evaluated
// is a step, and every operation charges its bytes to the render's Budget
// (jinja/budget.h), so a hostile template ends in a LimitError.
#pragma once

#include <algorithm>
#include <ctime>
#include <deque>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "edgellm/jinja.h"
#include "jinja/ast.h"
#include "jinja/budget.h"
#include "jinja/value.h"

namespace edgellm::jinja {

struct Scope {
  std::vector<std::pair<std::string, Value>> vars;
  Scope* parent = nullptr;
  size_t index = 0;  // its place in Interp::scopes_
  size_t bytes = 0;  // charged to the render's budget (its struct and variables)
  // What one variable costs: its entry, its name and the vector's slack.
  static constexpr size_t kVarBytes = sizeof(std::pair<std::string, Value>) * 2 + 32;
  const Value* find(const std::string& name) const {
    for (const Scope* s = this; s; s = s->parent) {
      charge_work(s->vars.size() * kLookupBytes);  // a linear search
      for (const auto& [k, v] : s->vars)
        if (k == name) return &v;
    }
    return nullptr;
  }
  void set(const std::string& name, Value v) {
    for (auto& [k, old] : vars)
      if (k == name) {
        old = std::move(v);
        return;
      }
    if (Budget* b = active_budget()) {
      b->acquire(kVarBytes);
      bytes += kVarBytes;
    }
    vars.emplace_back(name, std::move(v));
  }
};

struct LoopState {
  std::shared_ptr<const List> items;
  int64_t index0 = 0;
  bool last_off_by_one = false;  // fault injection
  bool has_changed = false;
  Value last_changed;
};

class Interp {
 public:
  Interp(const Options& options) : opt(options), budget(options.limits) {}
  ~Interp();
  Interp(const Interp&) = delete;
  Interp& operator=(const Interp&) = delete;

  std::string render(const Body& body, const nlohmann::ordered_json& context);

  Value eval(const Expr& e, Scope& s);
  Value call(const Value& fn, CallArgs& args, int line);
  // Rendered body of a macro or call block, for its callable.
  Value call_macro(const Stmt& m, Scope* closure, CallArgs& args, const Value& caller, int line);

  void step(int line) { budget.step(line); }
  std::time_t now() const { return opt.now ? *opt.now : std::time(nullptr); }
  bool utc() const { return opt.now.has_value(); }

  const Options& opt;
  // Declared before the scopes: the values they hold give their bytes back to it.
  Budget budget;

  // namespace(): the one mutable object, kept to break its cycles at the end.
  std::shared_ptr<Namespace> new_namespace();

 private:
  enum class Flow { normal, break_, continue_ };
  Flow exec(const Body& body, Scope& s, TextBuffer& out);
  Flow exec_for(const Stmt& st, Scope& s, TextBuffer& out);
  void assign(const Expr& target, const Value& v, Scope& s, int line);
  Value apply_filter(const Expr& f, const Value& subject, Scope& s);
  void eval_args(const Expr& e, Scope& s, CallArgs& args);
  Value binary(const std::string& op, const Value& a, const Value& b, int line);
  Value slice(const Value& obj, const Expr& sl, Scope& s, int line);
  Scope* new_scope(Scope* parent);
  // A macro or call block defined in `s` keeps a pointer to it: `s` and every
  // scope before it live until the render ends.
  void pin(const Scope& s) { pinned_ = std::max(pinned_, s.index + 1); }
  // Frees the scopes opened since `mark` (scopes_.size() then), but no pinned one.
  void free_scopes(size_t mark);
  // Frees the scopes a statement opened when it ends, however it ends.
  struct ScopeMark {
    Interp& in;
    size_t mark;
    explicit ScopeMark(Interp& i) : in(i), mark(i.scopes_.size()) {}
    ~ScopeMark() { in.free_scopes(mark); }
  };

  // What a callable a macro or call block defines costs (never given back:
  // it pins its scope).
  static constexpr size_t kCallableBytes = 256;

  int depth_ = 0;
  std::vector<std::shared_ptr<Namespace>> namespaces_;
  // The open scopes, a stack (a deque: pointers to them stay valid as it grows).
  std::deque<Scope> scopes_;
  size_t pinned_ = 0;  // scopes_[0, pinned_) are kept to the end
};

// Iteration in Python: list/tuple items, dict keys, str code points; an
// undefined value iterates as empty.
std::shared_ptr<const List> iterate(const Value& v, int line);
// Python's `item in container`.
bool contains(const Value& container, const Value& item, int line);
[[noreturn]] void undefined_error(const Value& v, int line);

}  // namespace edgellm::jinja
