#include "jinja/interp.h"

#include <cmath>

#include "jinja/builtins.h"
#include "jinja/fault_injection.h"
#include "jinja/pystr.h"

namespace edgellm::jinja {

[[noreturn]] void undefined_error(const Value& v, int line) {
  throw TemplateError(v.s().empty() ? "value is undefined" : v.s(), line);
}

std::shared_ptr<const List> iterate(const Value& v, int line) {
  using T = Value::Type;
  switch (v.type) {
    case T::list:
    case T::tuple:
      if (v.generator && !v.s().empty()) throw TemplateError(v.s(), line);
      return v.list;
    case T::dict: {
      check_alloc_size(mul_sat(v.dict->items.size(), sizeof(Value)));
      List out;
      out.reserve(v.dict->items.size());
      for (const auto& kv : v.dict->items) out.push_back(kv.first);
      return hold_list(std::move(out));
    }
    case T::string: {
      // Each character becomes a Value and a string of its own.
      check_alloc_size(mul_sat(v.s().size(), sizeof(Value) + sizeof(std::string)));
      charge_work(v.s().size());
      List out;
      if (pystr::is_ascii(v.s())) {
        out.reserve(v.s().size());
        for (char c : v.s()) out.push_back(Value::string(std::string(1, c)));
      } else {
        for (char32_t c : pystr::decode(v.s())) {
          std::string ch;
          pystr::append_utf8(ch, c);
          out.push_back(Value::string(std::move(ch)));
        }
      }
      return hold_list(std::move(out));
    }
    case T::undefined:
      return std::make_shared<List>();
    default:
      throw TemplateError("'" + type_name(v) + "' object is not iterable", line);
  }
}

bool contains(const Value& container, const Value& item, int line) {
  using T = Value::Type;
  switch (container.type) {
    case T::string:
      if (!item.is_string())
        throw TemplateError("'in <string>' requires string as left operand, not " + type_name(item),
                            line);
      charge_work(search_cost(container.s().size(), item.s().size()));
      return container.s().find(item.s()) != std::string::npos;
    case T::list:
    case T::tuple:
      for (const Value& x : *container.list)
        if (equals(x, item)) return true;
      return false;
    case T::dict:
      return container.dict->find(item) != nullptr;
    case T::ns:
      return false;
    case T::undefined:
      return false;
    default:
      throw TemplateError("argument of type '" + type_name(container) + "' is not iterable", line);
  }
}

Interp::~Interp() {
  // A namespace can hold itself ({% set ns.me = ns %}): its attributes go
  // first, so that no cycle outlives the render.
  for (const auto& ns : namespaces_) ns->attrs.items.clear();
}

Scope* Interp::new_scope(Scope* parent) {
  budget.acquire(sizeof(Scope));
  scopes_.emplace_back();
  scopes_.back().bytes = sizeof(Scope);
  scopes_.back().parent = parent;
  scopes_.back().index = scopes_.size() - 1;
  return &scopes_.back();
}

void Interp::free_scopes(size_t mark) {
  while (scopes_.size() > std::max(mark, pinned_)) {
    budget.release(scopes_.back().bytes);
    scopes_.pop_back();
  }
}

std::shared_ptr<Namespace> Interp::new_namespace() {
  budget.acquire(sizeof(Namespace) + Scope::kVarBytes);
  namespaces_.push_back(std::make_shared<Namespace>());
  return namespaces_.back();
}

std::string Interp::render(const Body& body, const nlohmann::ordered_json& context) {
  const ActiveBudget active(budget);
  Scope* root = new_scope(nullptr);
  if (!context.is_object()) throw TemplateError("the template context must be a JSON object", 0);
  for (const auto& [k, v] : context.items()) root->set(k, from_json(v));
  TextBuffer out;
  exec(body, *root, out);
  return out.take();
}

Interp::Flow Interp::exec(const Body& body, Scope& s, TextBuffer& out) {
  for (const StmtPtr& p : body) {
    const Stmt& st = *p;
    step(st.line);
    switch (st.kind) {
      case Stmt::Kind::data:
        out.append(st.text);
        break;
      case Stmt::Kind::print: {
        const Value v = eval(*st.value, s);
        out.append(v.is_string() ? v.s() : to_str(v));
        break;
      }
      case Stmt::Kind::if_: {
        bool done = false;
        for (size_t k = 0; k < st.conds.size() && !done; ++k) {
          if (truthy(eval(*st.conds[k], s))) {
            done = true;
            const Flow f = exec(st.bodies[k], s, out);
            if (f != Flow::normal) return f;
          }
        }
        if (!done) {
          const Flow f = exec(st.else_body, s, out);
          if (f != Flow::normal) return f;
        }
        break;
      }
      case Stmt::Kind::for_: {
        const Flow f = exec_for(st, s, out);
        if (f != Flow::normal) return f;
        break;
      }
      case Stmt::Kind::set:
        assign(*st.target, eval(*st.value, s), s, st.line);
        break;
      case Stmt::Kind::set_block: {
        TextBuffer text;
        {
          const ScopeMark mark(*this);
          exec(st.body, *new_scope(&s), text);
        }
        Value v = Value::string(text.take());
        for (const ExprPtr& f : st.filters) v = apply_filter(*f, v, s);
        assign(*st.target, v, s, st.line);
        break;
      }
      case Stmt::Kind::macro: {
        const Stmt* m = &st;
        Scope* closure = &s;
        pin(s);
        budget.acquire(kCallableBytes);
        Value fn = Value::function(st.text, [m, closure](Interp& in, CallArgs& args, int line) {
          return in.call_macro(*m, closure, args, Value::undefined(), line);
        });
        s.set(st.text, std::move(fn));
        break;
      }
      case Stmt::Kind::call_block: {
        const Stmt* m = &st;
        Scope* closure = &s;
        pin(s);
        budget.acquire(kCallableBytes);
        Value caller =
            Value::function("caller", [m, closure](Interp& in, CallArgs& args, int line) {
              return in.call_macro(*m, closure, args, Value::undefined(), line);
            });
        const Expr& call = *st.value;
        Value fn = eval(*call.a, s);
        CallArgs args;
        eval_args(call, s, args);
        args.kwargs.emplace_back("caller", caller);
        const Value v = this->call(fn, args, st.line);
        out.append(to_str(v));
        break;
      }
      case Stmt::Kind::filter_block: {
        TextBuffer text;
        {
          const ScopeMark mark(*this);
          exec(st.body, *new_scope(&s), text);
        }
        Value v = Value::string(text.take());
        for (const ExprPtr& f : st.filters) v = apply_filter(*f, v, s);
        out.append(to_str(v));
        break;
      }
      case Stmt::Kind::with: {
        const ScopeMark mark(*this);
        Scope* inner = new_scope(&s);
        for (size_t k = 0; k < st.targets.size(); ++k)
          assign(*st.targets[k], eval(*st.values[k], s), *inner, st.line);
        const Flow f = exec(st.body, *inner, out);
        if (f != Flow::normal) return f;
        break;
      }
      case Stmt::Kind::generation: {
        const ScopeMark mark(*this);
        const Flow f = exec(st.body, *new_scope(&s), out);
        if (f != Flow::normal) return f;
        break;
      }
      case Stmt::Kind::break_:
        return Flow::break_;
      case Stmt::Kind::continue_:
        return Flow::continue_;
    }
  }
  return Flow::normal;
}

Interp::Flow Interp::exec_for(const Stmt& st, Scope& s, TextBuffer& out) {
  const Value seq = eval(*st.iter, s);
  if (seq.is_undefined() && !seq.s().empty() && false) undefined_error(seq, st.line);
  std::shared_ptr<const List> items = iterate(seq, st.line);
  if (st.cond) {
    List kept;
    for (const Value& item : *items) {
      step(st.line);
      const ScopeMark mark(*this);
      Scope* probe = new_scope(&s);
      assign(*st.target, item, *probe, st.line);
      if (truthy(eval(*st.cond, *probe))) kept.push_back(item);
    }
    items = hold_list(std::move(kept));
  }
  if (items->empty()) {
    const ScopeMark mark(*this);
    exec(st.else_body, *new_scope(&s), out);
    return Flow::normal;
  }
  auto state = std::make_shared<LoopState>();
  state->items = items;
  state->last_off_by_one = fault::active() == fault::Fault::loop_last_off_by_one;
  Value loop;
  loop.type = Value::Type::loop;
  loop.loop = state;
  for (size_t k = 0; k < items->size(); ++k) {
    step(st.line);
    state->index0 = static_cast<int64_t>(k);
    const ScopeMark mark(*this);  // the iteration's scope goes with it
    Scope* iter = new_scope(&s);
    assign(*st.target, (*items)[k], *iter, st.line);
    iter->set("loop", loop);
    const Flow f = exec(st.body, *iter, out);
    if (f == Flow::break_) break;
  }
  return Flow::normal;
}

void Interp::assign(const Expr& target, const Value& v, Scope& s, int line) {
  if (target.kind == Expr::Kind::name) {
    s.set(target.name, v);
    return;
  }
  if (target.kind == Expr::Kind::getattr) {
    const Value* ns = s.find(target.a->name);
    if (!ns || ns->type != Value::Type::ns)
      throw TemplateError("cannot assign attribute on non-namespace object", line);
    ns->ns->attrs.set(Value::string(target.name), v);
    return;
  }
  // tuple unpacking
  std::shared_ptr<const List> items = iterate(v, line);
  if (items->size() != target.items.size())
    throw TemplateError(
        items->size() < target.items.size()
            ? "not enough values to unpack (expected " + std::to_string(target.items.size()) +
                  ", got " + std::to_string(items->size()) + ")"
            : "too many values to unpack (expected " + std::to_string(target.items.size()) + ")",
        line);
  for (size_t k = 0; k < items->size(); ++k) s.set(target.items[k]->name, (*items)[k]);
}

void Interp::eval_args(const Expr& e, Scope& s, CallArgs& args) {
  args.args.reserve(e.items.size());
  for (const ExprPtr& a : e.items) args.args.push_back(eval(*a, s));
  for (const auto& [k, a] : e.kwargs) args.kwargs.emplace_back(k, eval(*a, s));
  if (e.star_args) {
    const Value v = eval(*e.star_args, s);
    const auto iterated1 = iterate(v, e.line);
    for (const Value& x : *iterated1) args.args.push_back(x);
  }
  if (e.star_kwargs) {
    const Value v = eval(*e.star_kwargs, s);
    if (v.type != Value::Type::dict)
      throw TemplateError("argument after ** must be a mapping", e.line);
    for (const auto& [k, x] : v.dict->items) {
      if (!k.is_string()) throw TemplateError("keywords must be strings", e.line);
      args.kwargs.emplace_back(k.s(), x);
    }
  }
}

Value Interp::apply_filter(const Expr& f, const Value& subject, Scope& s) {
  CallArgs args;
  eval_args(f, s, args);
  return f.filter(*this, subject, args, f.line);
}

Value Interp::call(const Value& fn, CallArgs& args, int line) {
  if (fn.type == Value::Type::callable) return fn.fn->fn(*this, args, line);
  if (fn.is_undefined()) undefined_error(fn, line);
  throw TemplateError("'" + type_name(fn) + "' object is not callable", line);
}

Value Interp::call_macro(const Stmt& m, Scope* closure, CallArgs& args, const Value& caller,
                         int line) {
  if (++depth_ > opt.limits.max_depth) {
    depth_ = 0;
    throw LimitError(
        "macro calls nested too deeply (over " + std::to_string(opt.limits.max_depth) + ")", line);
  }
  const ScopeMark mark(*this);
  Scope* scope = new_scope(closure);
  const size_t n = m.params.size();
  std::vector<bool> bound(n, false);
  List varargs;
  for (size_t k = 0; k < args.args.size(); ++k) {
    if (k < n) {
      scope->set(m.params[k], args.args[k]);
      bound[k] = true;
    } else {
      varargs.push_back(args.args[k]);
    }
  }
  Dict kwargs;
  Value caller_v = caller;
  for (auto& [key, v] : args.kwargs) {
    bool found = false;
    for (size_t k = 0; k < n; ++k)
      if (m.params[k] == key) {
        if (bound[k])
          throw TemplateError(
              "macro '" + m.text + "' got multiple values for argument '" + key + "'", line);
        scope->set(key, v);
        bound[k] = true;
        found = true;
      }
    if (found) continue;
    if (key == "caller") {
      caller_v = v;
      continue;
    }
    kwargs.set(Value::string(key), v);
  }
  for (size_t k = 0; k < n; ++k) {
    if (bound[k]) continue;
    if (m.defaults[k])
      scope->set(m.params[k], eval(*m.defaults[k], *scope));
    else
      scope->set(m.params[k], Value::undefined("parameter '" + m.params[k] + "' was not provided"));
  }
  scope->set("varargs", Value::make_list(std::move(varargs), true));
  scope->set("kwargs", Value::make_dict(std::move(kwargs)));
  if (!caller_v.is_undefined()) scope->set("caller", caller_v);
  TextBuffer out;
  exec(m.body, *scope, out);
  --depth_;
  return Value::string(out.take());
}

namespace {

int64_t checked(bool overflow, int64_t v, int line) {
  if (overflow) throw TemplateError("integer overflow (beyond 64 bits)", line);
  return v;
}

// The overflow flag is computed before the result is read (argument order is unspecified).
template <class Op>
int64_t checked_op(Op op, int64_t x, int64_t y, int line) {
  int64_t r = 0;
  const bool overflow = op(x, y, &r);
  return checked(overflow, r, line);
}
constexpr auto add = [](int64_t x, int64_t y, int64_t* r) {
  return __builtin_add_overflow(x, y, r);
};
constexpr auto sub = [](int64_t x, int64_t y, int64_t* r) {
  return __builtin_sub_overflow(x, y, r);
};
constexpr auto mul = [](int64_t x, int64_t y, int64_t* r) {
  return __builtin_mul_overflow(x, y, r);
};

double py_fmod(double a, double b) {
  double m = std::fmod(a, b);
  if (m != 0 && ((m < 0) != (b < 0))) m += b;
  return m;
}

[[noreturn]] void bad_operands(const std::string& op, const Value& a, const Value& b, int line) {
  throw TemplateError("unsupported operand type(s) for " + op + ": '" + type_name(a) + "' and '" +
                          type_name(b) + "'",
                      line);
}

}  // namespace

Value Interp::binary(const std::string& op, const Value& a, const Value& b, int line) {
  if (a.is_undefined()) undefined_error(a, line);
  if (b.is_undefined()) undefined_error(b, line);
  const char c0 = op[0];
  if (a.is_number() && b.is_number()) {
    const bool ints = a.is_int() && b.is_int();
    const int64_t x = a.as_int(), y = b.as_int();
    const double fx = a.as_double(), fy = b.as_double();
    if (op == "+") {
      if (ints) return Value::integer(checked_op(add, x, y, line));
      return Value::floating(fx + fy);
    }
    if (op == "-") {
      if (ints) return Value::integer(checked_op(sub, x, y, line));
      return Value::floating(fx - fy);
    }
    if (op == "*") {
      if (ints) return Value::integer(checked_op(mul, x, y, line));
      return Value::floating(fx * fy);
    }
    if (op == "/") {
      if (fy == 0) throw TemplateError("division by zero", line);
      return Value::floating(fx / fy);
    }
    if (op == "//") {
      if (ints) {
        if (y == 0) throw TemplateError("integer division or modulo by zero", line);
        if (x == INT64_MIN && y == -1) checked(true, 0, line);
        int64_t q = x / y;
        if ((x % y != 0) && ((x < 0) != (y < 0))) --q;
        return Value::integer(q);
      }
      if (fy == 0) throw TemplateError("float floor division by zero", line);
      return Value::floating(std::floor(fx / fy));
    }
    if (op == "%") {
      if (ints) {
        if (y == 0) throw TemplateError("integer division or modulo by zero", line);
        if (y == -1) return Value::integer(0);
        int64_t m = x % y;
        if (m != 0 && ((m < 0) != (y < 0))) m += y;
        return Value::integer(m);
      }
      if (fy == 0) throw TemplateError("float modulo", line);
      return Value::floating(py_fmod(fx, fy));
    }
    if (op == "**") {
      if (ints && y >= 0) {
        int64_t result = 1, base = x;
        int64_t e = y;
        while (e > 0) {
          if (e & 1) checked(__builtin_mul_overflow(result, base, &result), 0, line);
          e >>= 1;
          if (e) checked(__builtin_mul_overflow(base, base, &base), 0, line);
        }
        return Value::integer(result);
      }
      if (fx == 0 && fy < 0) throw TemplateError("0.0 cannot be raised to a negative power", line);
      return Value::floating(std::pow(fx, fy));
    }
  }
  if (c0 == '+' && a.is_string() && b.is_string()) {
    const size_t n = add_sat(a.s().size(), b.s().size());
    budget.check_string(n);
    budget.work(n);
    if (!a.markup && !b.markup) return Value::string(a.s() + b.s());
    // Markup.__add__ / __radd__: the plain side is escaped, the sum is Markup.
    Value v = Value::string((a.markup ? a.s() : html_escape(a.s())) +
                            (b.markup ? b.s() : html_escape(b.s())));
    v.markup = true;
    return v;
  }
  if (c0 == '+' && a.is_sequence() && a.type == b.type && !a.generator && !b.generator) {
    const size_t n = add_sat(a.list->size(), b.list->size());
    budget.check_alloc(mul_sat(n, sizeof(Value)));
    budget.work(mul_sat(n, sizeof(Value)));
    List items;
    items.reserve(n);
    items.insert(items.end(), a.list->begin(), a.list->end());
    items.insert(items.end(), b.list->begin(), b.list->end());
    return Value::make_list(std::move(items), a.type == Value::Type::tuple);
  }
  if (op == "*" && ((a.is_int() && (b.is_string() || b.is_sequence())) ||
                    (b.is_int() && (a.is_string() || a.is_sequence())))) {
    const Value& seq = a.is_int() ? b : a;
    const int64_t n = std::max<int64_t>(0, a.is_int() ? a.as_int() : b.as_int());
    if (seq.is_string()) {
      const size_t bytes = mul_sat(static_cast<size_t>(n), seq.s().size());
      budget.check_string(bytes);
      budget.work(bytes);
      std::string out;
      out.reserve(bytes);
      for (int64_t k = 0; k < n; ++k) out += seq.s();
      return Value::string(std::move(out));
    }
    if (seq.generator) bad_operands(op, a, b, line);
    const size_t count = mul_sat(static_cast<size_t>(n), seq.list->size());
    budget.check_alloc(mul_sat(count, sizeof(Value)));
    budget.work(mul_sat(count, sizeof(Value)));
    List items;
    items.reserve(count);
    for (int64_t k = 0; k < n; ++k) items.insert(items.end(), seq.list->begin(), seq.list->end());
    return Value::make_list(std::move(items), seq.type == Value::Type::tuple);
  }
  if (op == "%" && a.is_string()) return percent_format(a, b, line);
  bad_operands(op, a, b, line);
}

namespace {

// Python's slice.indices for a sequence of n items.
void slice_indices(int64_t n, const Value& start, const Value& stop, const Value& step_v,
                   int64_t& b, int64_t& e, int64_t& st, int line) {
  st = step_v.is_none() || step_v.is_undefined() ? 1 : step_v.as_int();
  if (st == 0) throw TemplateError("slice step cannot be zero", line);
  auto norm = [&](const Value& v, int64_t dflt, bool is_start) {
    if (v.is_none() || v.is_undefined()) return dflt;
    if (!v.is_int()) throw TemplateError("slice indices must be integers or None", line);
    int64_t x = v.as_int();
    if (x < 0) {
      x += n;
      if (x < 0) x = st < 0 ? -1 : 0;
    } else if (x >= n) {
      x = st < 0 ? n - 1 : n;
    }
    (void)is_start;
    return x;
  };
  b = norm(start, st < 0 ? n - 1 : 0, true);
  e = norm(stop, st < 0 ? -1 : n, false);
}

}  // namespace

Value Interp::slice(const Value& obj, const Expr& sl, Scope& s, int line) {
  const Value start = sl.a ? eval(*sl.a, s) : Value::none();
  const Value stop = sl.b ? eval(*sl.b, s) : Value::none();
  const Value stp = sl.c ? eval(*sl.c, s) : Value::none();
  if (obj.is_undefined()) undefined_error(obj, line);
  for (const Value* v : {&start, &stop, &stp})
    if (!v->is_none() && !v->is_int())
      throw TemplateError("slice indices must be integers or None", line);
  auto pick = [&](int64_t n, auto&& emit) {
    int64_t b, e, st;
    slice_indices(n, start, stop, stp, b, e, st, line);
    if (st > 0)
      for (int64_t k = b; k < e; k += st) emit(k);
    else
      for (int64_t k = b; k > e; k += st) emit(k);
  };
  if (obj.is_string()) {
    charge_work(obj.s().size());
    if (pystr::is_ascii(obj.s())) {
      std::string out;
      pick(static_cast<int64_t>(obj.s().size()), [&](int64_t k) { out += obj.s()[k]; });
      return Value::string(std::move(out));
    }
    const std::u32string u = pystr::decode(obj.s());
    std::u32string out;
    pick(static_cast<int64_t>(u.size()), [&](int64_t k) { out += u[k]; });
    return Value::string(pystr::encode(out));
  }
  if (obj.generator) throw TemplateError("'generator' object is not subscriptable", line);
  if (obj.is_sequence()) {
    List out;
    pick(static_cast<int64_t>(obj.list->size()), [&](int64_t k) { out.push_back((*obj.list)[k]); });
    return Value::make_list(std::move(out), obj.type == Value::Type::tuple);
  }
  if (obj.type == Value::Type::dict) throw TemplateError("unhashable type: 'slice'", line);
  return Value::undefined("'" + type_name(obj) + " object' has no attribute 'slice'");
}

Value Interp::eval(const Expr& e, Scope& s) {
  step(e.line);
  using K = Expr::Kind;
  switch (e.kind) {
    case K::constant:
      return e.constant;
    case K::name: {
      if (const Value* v = s.find(e.name)) return *v;
      Value g = global(e.name);
      if (!g.is_undefined()) return g;
      return Value::undefined("'" + e.name + "' is undefined");
    }
    case K::list:
    case K::tuple: {
      List items;
      items.reserve(e.items.size());
      for (const ExprPtr& x : e.items) items.push_back(eval(*x, s));
      return Value::make_list(std::move(items), e.kind == K::tuple);
    }
    case K::dict: {
      Dict d;
      for (size_t k = 0; k + 1 < e.items.size(); k += 2) {
        Value key = eval(*e.items[k], s);
        if (key.is_sequence() && key.type == Value::Type::list)
          throw TemplateError("unhashable type: 'list'", e.line);
        if (key.type == Value::Type::dict) throw TemplateError("unhashable type: 'dict'", e.line);
        d.set(std::move(key), eval(*e.items[k + 1], s));
      }
      return Value::make_dict(std::move(d));
    }
    case K::getattr: {
      const Value obj = eval(*e.a, s);
      return get_attr(*this, obj, e.name, e.line);
    }
    case K::getitem: {
      const Value obj = eval(*e.a, s);
      if (e.b->kind == K::slice) return slice(obj, *e.b, s, e.line);
      const Value key = eval(*e.b, s);
      return get_item(*this, obj, key, e.line);
    }
    case K::slice:
      throw TemplateError("a slice outside a subscript", e.line);
    case K::call: {
      if (e.a->kind == K::getattr) {
        const Value obj = eval(*e.a->a, s);
        CallArgs args;
        eval_args(e, s, args);
        Value result;
        if (call_method(*this, obj, e.a->name, args, e.line, result)) return result;
        const Value fn = get_attr(*this, obj, e.a->name, e.line);
        return call(fn, args, e.line);
      }
      const Value fn = eval(*e.a, s);
      CallArgs args;
      eval_args(e, s, args);
      return call(fn, args, e.line);
    }
    case K::filter: {
      const Value subject = eval(*e.a, s);
      return apply_filter(e, subject, s);
    }
    case K::test: {
      const Value subject = eval(*e.a, s);
      CallArgs args;
      eval_args(e, s, args);
      const bool r = e.test(*this, subject, args, e.line);
      return Value::boolean(e.negated ? !r : r);
    }
    case K::neg:
    case K::pos: {
      const Value v = eval(*e.a, s);
      if (v.is_undefined()) undefined_error(v, e.line);
      if (!v.is_number())
        throw TemplateError(std::string("bad operand type for unary ") +
                                (e.kind == K::neg ? "-" : "+") + ": '" + type_name(v) + "'",
                            e.line);
      if (e.kind == K::pos) return v.type == Value::Type::boolean ? Value::integer(v.as_int()) : v;
      if (v.type == Value::Type::floating) return Value::floating(-v.f);
      if (v.as_int() == INT64_MIN) checked(true, 0, e.line);
      return Value::integer(-v.as_int());
    }
    case K::not_:
      return Value::boolean(!truthy(eval(*e.a, s)));
    case K::binary:
      return binary(e.name, eval(*e.a, s), eval(*e.b, s), e.line);
    case K::concat: {
      TextBuffer out;
      for (const ExprPtr& x : e.items) {
        const Value v = eval(*x, s);
        out.append(v.is_string() ? v.s() : to_str(v));
      }
      return Value::string(out.take());
    }
    case K::compare: {
      Value left = eval(*e.a, s);
      for (size_t k = 0; k < e.ops.size(); ++k) {
        Value right = eval(*e.items[k], s);
        const std::string& op = e.ops[k];
        bool r;
        if (op == "==")
          r = equals(left, right);
        else if (op == "!=")
          r = !equals(left, right);
        else if (op == "in")
          r = contains(right, left, e.line);
        else if (op == "notin")
          r = !contains(right, left, e.line);
        else {
          const int c = compare(left, right, e.line);
          r = op == "<" ? c < 0 : op == "<=" ? c <= 0 : op == ">" ? c > 0 : c >= 0;
        }
        if (!r) return Value::boolean(false);
        left = std::move(right);
      }
      return Value::boolean(true);
    }
    case K::and_: {
      Value l = eval(*e.a, s);
      if (!truthy(l)) return l;
      return eval(*e.b, s);
    }
    case K::or_: {
      Value l = eval(*e.a, s);
      if (truthy(l)) return l;
      return eval(*e.b, s);
    }
    case K::cond: {
      if (truthy(eval(*e.a, s))) return eval(*e.b, s);
      if (e.c) return eval(*e.c, s);
      return Value::undefined("the inline if expression on line " + std::to_string(e.line) +
                              " evaluated to false and no else section was defined.");
    }
  }
  return Value::undefined();
}

}  // namespace edgellm::jinja
