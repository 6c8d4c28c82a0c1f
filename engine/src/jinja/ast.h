// The parsed template: expression and statement nodes, as jinja2's parser
// builds them (jinja2/nodes.py), with filters and tests resolved at parse time
// so that an unknown one is a parse error, as in jinja2.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "jinja/value.h"

namespace edgellm::jinja {

struct Expr;
struct Stmt;
using ExprPtr = std::unique_ptr<Expr>;
using StmtPtr = std::unique_ptr<Stmt>;
using Body = std::vector<StmtPtr>;

using FilterFn = Value (*)(Interp&, const Value&, CallArgs&, int line);
using TestFn = bool (*)(Interp&, const Value&, CallArgs&, int line);

struct Expr {
  enum class Kind {
    constant,
    name,
    list,
    tuple,
    dict,  // items: key, value, key, value, ...
    getattr,
    getitem,
    slice,  // a, b, c: start, stop, step (each may be null)
    call,
    filter,
    test,
    neg,
    pos,
    not_,
    binary,   // op: + - * / // % **
    concat,   // items
    compare,  // a, then ops[k] items[k]
    and_,
    or_,
    cond,  // a if test else c: a = test, b = then, c = else (may be null)
  };
  Kind kind;
  int line = 0;
  Value constant;
  std::string name;  // name, attribute, filter / test name, binary operator
  ExprPtr a, b, c;
  std::vector<ExprPtr> items;  // elements, call arguments, compare operands
  std::vector<std::pair<std::string, ExprPtr>> kwargs;
  std::vector<std::string> ops;
  ExprPtr star_args, star_kwargs;
  FilterFn filter = nullptr;
  TestFn test = nullptr;
  bool negated = false;
};

struct Stmt {
  enum class Kind {
    data,
    print,
    if_,        // conds[k] -> bodies[k]; else_body
    for_,       // target in iter [if filter]; body; else_body
    set,        // target = value
    set_block,  // target = rendered body | filters
    macro,
    call_block,
    filter_block,
    with,
    break_,
    continue_,
    generation,
  };
  Kind kind;
  int line = 0;
  std::string text;                   // data; macro name
  ExprPtr target, value, iter, cond;  // cond: a for loop's filter
  std::vector<ExprPtr> conds;
  std::vector<Body> bodies;
  Body body, else_body;
  // macro / call block: parameters and their defaults (null when none)
  std::vector<std::string> params;
  std::vector<ExprPtr> defaults;
  std::vector<ExprPtr> filters;          // set_block / filter_block: filter nodes with a = null
  std::vector<ExprPtr> targets, values;  // with
};

struct Program {
  Body body;
};

}  // namespace edgellm::jinja
