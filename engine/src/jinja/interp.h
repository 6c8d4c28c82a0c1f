// The evaluator: statements write into a string, expressions give Values.
// Scopes follow jinja2's: the template's top level, one scope per loop
// iteration (a `set` inside a loop body does not outlive the iteration), one
// per macro call; `if` opens none. Every node evaluated counts one step
// against Limits::max_steps, so a hostile template ends in a TemplateError.
#pragma once

#include <ctime>
#include <deque>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "edgellm/jinja.h"
#include "jinja/ast.h"
#include "jinja/value.h"

namespace edgellm::jinja {

struct Scope {
  std::vector<std::pair<std::string, Value>> vars;
  Scope* parent = nullptr;
  const Value* find(const std::string& name) const {
    for (const Scope* s = this; s; s = s->parent)
      for (const auto& [k, v] : s->vars)
        if (k == name) return &v;
    return nullptr;
  }
  void set(const std::string& name, Value v) {
    for (auto& [k, old] : vars)
      if (k == name) {
        old = std::move(v);
        return;
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
  Interp(const Options& options) : opt(options) {}

  std::string render(const Body& body, const nlohmann::ordered_json& context);

  Value eval(const Expr& e, Scope& s);
  Value call(const Value& fn, CallArgs& args, int line);
  // Rendered body of a macro or call block, for its callable.
  Value call_macro(const Stmt& m, Scope* closure, CallArgs& args, const Value& caller, int line);

  void step(int line) {
    if (++steps_ > opt.limits.max_steps)
      throw TemplateError(
          "template exceeded its work limit (" + std::to_string(opt.limits.max_steps) + " steps)",
          line);
  }
  void check_size(size_t n, int line) const {
    if (n > opt.limits.max_output)
      throw TemplateError("template output exceeds the limit of " +
                              std::to_string(opt.limits.max_output) + " bytes",
                          line);
  }
  std::time_t now() const { return opt.now ? *opt.now : std::time(nullptr); }
  bool utc() const { return opt.now.has_value(); }

  const Options& opt;

 private:
  enum class Flow { normal, break_, continue_ };
  Flow exec(const Body& body, Scope& s, std::string& out);
  Flow exec_for(const Stmt& st, Scope& s, std::string& out);
  void assign(const Expr& target, const Value& v, Scope& s, int line);
  Value apply_filter(const Expr& f, const Value& subject, Scope& s);
  void eval_args(const Expr& e, Scope& s, CallArgs& args);
  Value binary(const std::string& op, const Value& a, const Value& b, int line);
  Value slice(const Value& obj, const Expr& sl, Scope& s, int line);
  Scope* new_scope(Scope* parent) {
    scopes_.emplace_back();
    scopes_.back().parent = parent;
    return &scopes_.back();
  }

  size_t steps_ = 0;
  int depth_ = 0;
  std::deque<Scope> scopes_;  // every scope of this render; macros keep pointers to theirs
};

// Iteration in Python: list/tuple items, dict keys, str code points; an
// undefined value iterates as empty.
std::shared_ptr<const List> iterate(const Value& v, int line);
// Python's `item in container`.
bool contains(const Value& container, const Value& item, int line);
[[noreturn]] void undefined_error(const Value& v, int line);

}  // namespace edgellm::jinja
