// Recursive descent over the tokens, following jinja2/parser.py: the same
// operator precedence (condexpr < or < and < not < compare < +,- < ~ < *,/,//,%
// < ** < unary, then postfix, filters and tests), the same statement tags.
#include "jinja/parser.h"

#include <charconv>

#include "edgellm/jinja.h"
#include "jinja/builtins.h"

namespace edgellm::jinja {

namespace {

class Parser {
 public:
  Parser(std::vector<Token> tokens, int max_depth) : t_(std::move(tokens)), max_depth_(max_depth) {}

  Body parse_template() {
    Body body = subparse({});
    if (cur().type != Tok::eof) fail("unexpected tag", cur().line);
    return body;
  }

 private:
  struct Depth {
    explicit Depth(Parser& p) : p_(p) {
      if (++p_.depth_ > p_.max_depth_)
        throw LimitError(
            "template nested too deeply (over " + std::to_string(p_.max_depth_) + " levels)",
            p_.cur().line);
    }
    ~Depth() { --p_.depth_; }
    Parser& p_;
  };

  [[noreturn]] static void fail(const std::string& msg, int line) {
    throw TemplateError(msg, line);
  }

  const Token& cur() const { return t_[i_]; }
  const Token& peek(size_t k = 1) const { return t_[std::min(i_ + k, t_.size() - 1)]; }
  const Token& next() {
    const Token& t = t_[i_];
    if (i_ + 1 < t_.size()) ++i_;
    return t;
  }
  bool is_op(const char* op) const { return cur().type == Tok::op && cur().text == op; }
  bool is_name(const char* n) const { return cur().type == Tok::name && cur().text == n; }
  bool skip_op(const char* op) {
    if (!is_op(op)) return false;
    next();
    return true;
  }
  bool skip_name(const char* n) {
    if (!is_name(n)) return false;
    next();
    return true;
  }
  static std::string describe(const Token& t) {
    switch (t.type) {
      case Tok::eof:
        return "end of template";
      case Tok::block_end:
        return "end of statement block";
      case Tok::var_end:
        return "end of print statement";
      case Tok::data:
        return "template data";
      default:
        return "'" + t.text + "'";
    }
  }
  void expect_op(const char* op) {
    if (!skip_op(op))
      fail("expected '" + std::string(op) + "', got " + describe(cur()), cur().line);
  }
  std::string expect_name() {
    if (cur().type != Tok::name) fail("expected a name, got " + describe(cur()), cur().line);
    return next().text;
  }
  void expect_block_end() {
    if (cur().type != Tok::block_end)
      fail("expected end of statement block, got " + describe(cur()), cur().line);
    next();
  }

  static ExprPtr node(Expr::Kind k, int line) {
    auto e = std::make_unique<Expr>();
    e->kind = k;
    e->line = line;
    return e;
  }

  // Statements until a block whose tag is one of `end_tags` (left current:
  // the tag name token), or the end of the template.
  Body subparse(const std::vector<std::string>& end_tags) {
    Depth d(*this);
    Body body;
    while (cur().type != Tok::eof) {
      const Token& t = cur();
      if (t.type == Tok::data) {
        auto s = std::make_unique<Stmt>();
        s->kind = Stmt::Kind::data;
        s->line = t.line;
        s->text = t.text;
        body.push_back(std::move(s));
        next();
      } else if (t.type == Tok::var_begin) {
        next();
        auto s = std::make_unique<Stmt>();
        s->kind = Stmt::Kind::print;
        s->line = t.line;
        s->value = parse_tuple(true, false, {});
        if (cur().type != Tok::var_end)
          fail("expected end of print statement, got " + describe(cur()), cur().line);
        next();
        body.push_back(std::move(s));
      } else if (t.type == Tok::block_begin) {
        next();
        if (cur().type == Tok::name)
          for (const auto& e : end_tags)
            if (cur().text == e) return body;
        body.push_back(parse_statement(end_tags));
      } else {
        fail("unexpected " + describe(t), t.line);
      }
    }
    if (!end_tags.empty())
      fail("unexpected end of template: a block needs closing (one of: " + join(end_tags) + ")",
           cur().line);
    return body;
  }

  static std::string join(const std::vector<std::string>& v) {
    std::string out;
    for (const auto& s : v) out += (out.empty() ? "" : ", ") + s;
    return out;
  }

  StmtPtr stmt(Stmt::Kind k, int line) {
    auto s = std::make_unique<Stmt>();
    s->kind = k;
    s->line = line;
    return s;
  }

  StmtPtr parse_statement(const std::vector<std::string>& outer_end) {
    if (cur().type != Tok::name) fail("tag name expected, got " + describe(cur()), cur().line);
    const std::string tag = cur().text;
    const int line = cur().line;
    next();
    if (tag == "if") return parse_if(line);
    if (tag == "for") return parse_for(line);
    if (tag == "set") return parse_set(line);
    if (tag == "macro") return parse_macro(line);
    if (tag == "call") return parse_call_block(line);
    if (tag == "filter") return parse_filter_block(line);
    if (tag == "with") return parse_with(line);
    if (tag == "break" || tag == "continue") {
      if (loop_depth_ == 0) fail("'" + tag + "' is only allowed inside a loop", line);
      expect_block_end();
      return stmt(tag == "break" ? Stmt::Kind::break_ : Stmt::Kind::continue_, line);
    }
    if (tag == "generation") {
      expect_block_end();
      auto s = stmt(Stmt::Kind::generation, line);
      s->body = subparse({"endgeneration"});
      next();
      expect_block_end();
      return s;
    }
    static const char* unsupported[] = {"extends",    "block", "include", "import", "from",
                                        "autoescape", "raw",   "do",      "trans",  "pluralize"};
    for (const char* u : unsupported)
      if (tag == u)
        fail("unsupported tag '" + tag + "' (chat templates are rendered on their own)", line);
    (void)outer_end;
    fail("Encountered unknown tag '" + tag + "'", line);
  }

  StmtPtr parse_if(int line) {
    auto s = stmt(Stmt::Kind::if_, line);
    while (true) {
      s->conds.push_back(parse_tuple(false, false, {}));
      expect_block_end();
      s->bodies.push_back(subparse({"elif", "else", "endif"}));
      const std::string t = next().text;
      if (t == "elif") continue;
      if (t == "else") {
        expect_block_end();
        s->else_body = subparse({"endif"});
        next();
      }
      break;
    }
    expect_block_end();
    return s;
  }

  StmtPtr parse_for(int line) {
    auto s = stmt(Stmt::Kind::for_, line);
    s->target = parse_assign_target(false, {"in"});
    if (!skip_name("in")) fail("expected 'in', got " + describe(cur()), cur().line);
    s->iter = parse_tuple(false, false, {"recursive"});
    if (skip_name("if")) s->cond = parse_expression(true);
    if (is_name("recursive")) fail("recursive for loops are not supported", cur().line);
    expect_block_end();
    ++loop_depth_;
    s->body = subparse({"endfor", "else"});
    --loop_depth_;
    if (next().text == "else") {
      expect_block_end();
      s->else_body = subparse({"endfor"});
      next();
    }
    expect_block_end();
    return s;
  }

  StmtPtr parse_set(int line) {
    ExprPtr target = parse_assign_target(true, {});
    if (skip_op("=")) {
      auto s = stmt(Stmt::Kind::set, line);
      s->target = std::move(target);
      s->value = parse_tuple(true, false, {});
      expect_block_end();
      return s;
    }
    auto s = stmt(Stmt::Kind::set_block, line);
    s->target = std::move(target);
    while (skip_op("|")) s->filters.push_back(parse_filter(nullptr));
    expect_block_end();
    s->body = subparse({"endset"});
    next();
    expect_block_end();
    return s;
  }

  void parse_signature(Stmt& s) {
    expect_op("(");
    while (!is_op(")")) {
      if (!s.params.empty()) expect_op(",");
      if (is_op(")")) break;
      const int l = cur().line;
      std::string p = expect_name();
      s.params.push_back(p);
      if (skip_op("="))
        s.defaults.push_back(parse_expression(true));
      else if (!s.defaults.empty() && s.defaults.back())
        fail("non-default argument follows default argument", l);
      else
        s.defaults.push_back(nullptr);
    }
    next();
  }

  StmtPtr parse_macro(int line) {
    auto s = stmt(Stmt::Kind::macro, line);
    s->text = expect_name();
    parse_signature(*s);
    expect_block_end();
    const int saved = loop_depth_;
    loop_depth_ = 0;
    s->body = subparse({"endmacro"});
    loop_depth_ = saved;
    next();
    expect_block_end();
    return s;
  }

  StmtPtr parse_call_block(int line) {
    auto s = stmt(Stmt::Kind::call_block, line);
    if (is_op("(")) parse_signature(*s);
    s->value = parse_expression(true);
    if (s->value->kind != Expr::Kind::call) fail("expected call", line);
    expect_block_end();
    const int saved = loop_depth_;
    loop_depth_ = 0;
    s->body = subparse({"endcall"});
    loop_depth_ = saved;
    next();
    expect_block_end();
    return s;
  }

  StmtPtr parse_filter_block(int line) {
    auto s = stmt(Stmt::Kind::filter_block, line);
    s->filters.push_back(parse_filter(nullptr));
    while (skip_op("|")) s->filters.push_back(parse_filter(nullptr));
    expect_block_end();
    s->body = subparse({"endfilter"});
    next();
    expect_block_end();
    return s;
  }

  StmtPtr parse_with(int line) {
    auto s = stmt(Stmt::Kind::with, line);
    while (cur().type != Tok::block_end) {
      if (!s->targets.empty()) expect_op(",");
      s->targets.push_back(parse_assign_target(false, {}));
      expect_op("=");
      s->values.push_back(parse_expression(true));
    }
    expect_block_end();
    s->body = subparse({"endwith"});
    next();
    expect_block_end();
    return s;
  }

  ExprPtr parse_assign_target(bool with_namespace, const std::vector<std::string>& extra_end) {
    const int line = cur().line;
    if (with_namespace && cur().type == Tok::name && peek().type == Tok::op && peek().text == ".") {
      auto e = node(Expr::Kind::getattr, line);
      e->a = node(Expr::Kind::name, line);
      e->a->name = next().text;
      next();
      e->name = expect_name();
      return e;
    }
    ExprPtr target = parse_tuple(true, true, extra_end);
    auto assignable = [](const Expr& x) {
      if (x.kind == Expr::Kind::name) return true;
      if (x.kind != Expr::Kind::tuple) return false;
      for (const auto& i : x.items)
        if (i->kind != Expr::Kind::name) return false;
      return true;
    };
    if (!assignable(*target)) fail("can't assign to this expression", line);
    for (const auto& n : target->kind == Expr::Kind::name ? std::vector<const Expr*>{target.get()}
                                                          : std::vector<const Expr*>{})
      if (n->name == "true" || n->name == "false" || n->name == "none") fail("can't assign", line);
    return target;
  }

  bool tuple_end(const std::vector<std::string>& extra_end) const {
    const Token& t = cur();
    if (t.type == Tok::var_end || t.type == Tok::block_end || t.type == Tok::eof) return true;
    if (t.type == Tok::op && t.text == ")") return true;
    if (t.type == Tok::name)
      for (const auto& e : extra_end)
        if (t.text == e) return true;
    return false;
  }

  // jinja2's parse_tuple: a comma makes a tuple.
  ExprPtr parse_tuple(bool with_condexpr, bool simplified,
                      const std::vector<std::string>& extra_end, bool explicit_parens = false) {
    const int line = cur().line;
    std::vector<ExprPtr> items;
    bool is_tuple = false;
    while (true) {
      if (!items.empty()) expect_op(",");
      if (tuple_end(extra_end)) break;
      if (simplified)
        items.push_back(parse_primary());
      else
        items.push_back(parse_expression(with_condexpr));
      if (is_op(","))
        is_tuple = true;
      else
        break;
    }
    if (!is_tuple) {
      if (!items.empty()) return std::move(items[0]);
      if (!explicit_parens) fail("Expected an expression, got " + describe(cur()), cur().line);
    }
    auto e = node(Expr::Kind::tuple, line);
    e->items = std::move(items);
    return e;
  }

  ExprPtr parse_expression(bool with_condexpr) {
    Depth d(*this);
    return with_condexpr ? parse_condexpr() : parse_or();
  }

  ExprPtr parse_condexpr() {
    const int line = cur().line;
    ExprPtr expr1 = parse_or();
    while (skip_name("if")) {
      ExprPtr expr2 = parse_or();
      ExprPtr expr3;
      if (skip_name("else")) expr3 = parse_condexpr();
      auto e = node(Expr::Kind::cond, line);
      e->a = std::move(expr2);
      e->b = std::move(expr1);
      e->c = std::move(expr3);
      expr1 = std::move(e);
    }
    return expr1;
  }

  ExprPtr parse_or() {
    ExprPtr left = parse_and();
    while (is_name("or")) {
      const int line = next().line;
      auto e = node(Expr::Kind::or_, line);
      e->a = std::move(left);
      e->b = parse_and();
      left = std::move(e);
    }
    return left;
  }

  ExprPtr parse_and() {
    ExprPtr left = parse_not();
    while (is_name("and")) {
      const int line = next().line;
      auto e = node(Expr::Kind::and_, line);
      e->a = std::move(left);
      e->b = parse_not();
      left = std::move(e);
    }
    return left;
  }

  ExprPtr parse_not() {
    if (is_name("not")) {
      Depth d(*this);
      const int line = next().line;
      auto e = node(Expr::Kind::not_, line);
      e->a = parse_not();
      return e;
    }
    return parse_compare();
  }

  ExprPtr parse_compare() {
    const int line = cur().line;
    ExprPtr expr = parse_math1();
    std::vector<std::string> ops;
    std::vector<ExprPtr> operands;
    while (true) {
      static const char* cmp[] = {"==", "!=", "<", "<=", ">", ">="};
      bool found = false;
      if (cur().type == Tok::op)
        for (const char* c : cmp)
          if (cur().text == c) {
            ops.push_back(next().text);
            operands.push_back(parse_math1());
            found = true;
            break;
          }
      if (found) continue;
      if (skip_name("in")) {
        ops.push_back("in");
        operands.push_back(parse_math1());
      } else if (is_name("not") && peek().type == Tok::name && peek().text == "in") {
        next();
        next();
        ops.push_back("notin");
        operands.push_back(parse_math1());
      } else {
        break;
      }
    }
    if (ops.empty()) return expr;
    auto e = node(Expr::Kind::compare, line);
    e->a = std::move(expr);
    e->ops = std::move(ops);
    e->items = std::move(operands);
    return e;
  }

  ExprPtr binary(std::string op, ExprPtr l, ExprPtr r, int line) {
    auto e = node(Expr::Kind::binary, line);
    e->name = std::move(op);
    e->a = std::move(l);
    e->b = std::move(r);
    return e;
  }

  ExprPtr parse_math1() {
    ExprPtr left = parse_concat();
    while (is_op("+") || is_op("-")) {
      const Token& t = next();
      const int line = t.line;
      std::string op = t.text;
      left = binary(op, std::move(left), parse_concat(), line);
    }
    return left;
  }

  ExprPtr parse_concat() {
    const int line = cur().line;
    ExprPtr first = parse_math2();
    if (!is_op("~")) return first;
    auto e = node(Expr::Kind::concat, line);
    e->items.push_back(std::move(first));
    while (skip_op("~")) e->items.push_back(parse_math2());
    return e;
  }

  ExprPtr parse_math2() {
    ExprPtr left = parse_pow();
    while (is_op("*") || is_op("/") || is_op("//") || is_op("%")) {
      const Token& t = next();
      const int line = t.line;
      std::string op = t.text;
      left = binary(op, std::move(left), parse_pow(), line);
    }
    return left;
  }

  ExprPtr parse_pow() {
    ExprPtr left = parse_unary(true);
    while (is_op("**")) {
      const int line = next().line;
      left = binary("**", std::move(left), parse_unary(true), line);
    }
    return left;
  }

  ExprPtr parse_unary(bool with_filter) {
    Depth d(*this);
    const int line = cur().line;
    ExprPtr e;
    if (is_op("-") || is_op("+")) {
      const bool neg = next().text == "-";
      e = node(neg ? Expr::Kind::neg : Expr::Kind::pos, line);
      e->a = parse_unary(false);
    } else {
      e = parse_primary();
    }
    e = parse_postfix(std::move(e));
    if (with_filter) e = parse_filter_expr(std::move(e));
    return e;
  }

  ExprPtr parse_primary() {
    Depth d(*this);
    const Token& t = cur();
    const int line = t.line;
    if (t.type == Tok::name) {
      next();
      auto e = node(Expr::Kind::constant, line);
      if (t.text == "true" || t.text == "True") {
        e->constant = Value::boolean(true);
      } else if (t.text == "false" || t.text == "False") {
        e->constant = Value::boolean(false);
      } else if (t.text == "none" || t.text == "None") {
        e->constant = Value::none();
      } else {
        e->kind = Expr::Kind::name;
        e->name = t.text;
      }
      return e;
    }
    if (t.type == Tok::string) {
      std::string s = next().text;
      while (cur().type == Tok::string) s += next().text;
      auto e = node(Expr::Kind::constant, line);
      e->constant = Value::string(std::move(s));
      return e;
    }
    if (t.type == Tok::integer || t.type == Tok::floating) {
      const Token& n = next();
      auto e = node(Expr::Kind::constant, line);
      if (n.type == Tok::floating) {
        double v = 0;
        std::from_chars(n.text.data(), n.text.data() + n.text.size(), v);
        e->constant = Value::floating(v);
      } else {
        const size_t colon = n.text.find(':');
        const int base = std::stoi(n.text.substr(0, colon));
        const std::string digits = n.text.substr(colon + 1);
        int64_t v = 0;
        auto r = std::from_chars(digits.data(), digits.data() + digits.size(), v, base);
        if (r.ec != std::errc()) fail("integer literal out of the supported 64-bit range", line);
        e->constant = Value::integer(v);
      }
      return e;
    }
    if (t.type == Tok::op && t.text == "(") {
      next();
      ExprPtr e = parse_tuple(true, false, {}, true);
      expect_op(")");
      return e;
    }
    if (t.type == Tok::op && t.text == "[") {
      next();
      auto e = node(Expr::Kind::list, line);
      while (!is_op("]")) {
        if (!e->items.empty()) expect_op(",");
        if (is_op("]")) break;
        e->items.push_back(parse_expression(true));
      }
      next();
      return e;
    }
    if (t.type == Tok::op && t.text == "{") {
      next();
      auto e = node(Expr::Kind::dict, line);
      while (!is_op("}")) {
        if (!e->items.empty()) expect_op(",");
        if (is_op("}")) break;
        e->items.push_back(parse_expression(true));
        expect_op(":");
        e->items.push_back(parse_expression(true));
      }
      next();
      return e;
    }
    fail("unexpected " + describe(t), line);
  }

  ExprPtr parse_postfix(ExprPtr e) {
    while (true) {
      if (is_op(".") || is_op("[")) {
        e = parse_subscript(std::move(e));
      } else if (is_op("(")) {
        e = parse_call(std::move(e));
      } else {
        return e;
      }
    }
  }

  ExprPtr parse_filter_expr(ExprPtr e) {
    while (true) {
      if (is_op("|")) {
        next();
        e = parse_filter(std::move(e));
      } else if (is_name("is")) {
        e = parse_test(std::move(e));
      } else if (is_op("(")) {
        e = parse_call(std::move(e));
      } else {
        return e;
      }
    }
  }

  ExprPtr parse_subscript(ExprPtr obj) {
    Depth d(*this);
    const Token& t = next();
    const int line = t.line;
    if (t.text == ".") {
      if (cur().type == Tok::name) {
        auto e = node(Expr::Kind::getattr, line);
        e->a = std::move(obj);
        e->name = next().text;
        return e;
      }
      if (cur().type == Tok::integer) {
        auto e = node(Expr::Kind::getitem, line);
        e->a = std::move(obj);
        e->b = parse_primary();
        return e;
      }
      fail("expected name or number", line);
    }
    std::vector<ExprPtr> args;
    while (!is_op("]")) {
      if (!args.empty()) {
        expect_op(",");
        if (is_op("]")) break;
      }
      args.push_back(parse_subscribed());
    }
    expect_op("]");
    auto e = node(Expr::Kind::getitem, line);
    e->a = std::move(obj);
    if (args.size() == 1) {
      e->b = std::move(args[0]);
    } else {
      e->b = node(Expr::Kind::tuple, line);
      e->b->items = std::move(args);
    }
    return e;
  }

  ExprPtr parse_subscribed() {
    const int line = cur().line;
    ExprPtr start;
    if (!is_op(":")) {
      start = parse_expression(true);
      if (!is_op(":")) return start;
    }
    next();
    auto e = node(Expr::Kind::slice, line);
    e->a = std::move(start);
    if (!is_op("]") && !is_op(",") && !is_op(":")) e->b = parse_expression(true);
    if (skip_op(":"))
      if (!is_op("]") && !is_op(",")) e->c = parse_expression(true);
    return e;
  }

  void parse_call_args(Expr& e) {
    expect_op("(");
    bool first = true;
    while (!is_op(")")) {
      if (!first) {
        expect_op(",");
        if (is_op(")")) break;
      }
      first = false;
      if (skip_op("*")) {
        e.star_args = parse_expression(true);
      } else if (skip_op("**")) {
        e.star_kwargs = parse_expression(true);
      } else if (cur().type == Tok::name && peek().type == Tok::op && peek().text == "=") {
        std::string key = next().text;
        next();
        e.kwargs.emplace_back(std::move(key), parse_expression(true));
      } else {
        if (!e.kwargs.empty() || e.star_args || e.star_kwargs)
          fail("invalid syntax for function call expression", cur().line);
        e.items.push_back(parse_expression(true));
      }
    }
    next();
  }

  ExprPtr parse_call(ExprPtr callee) {
    Depth d(*this);
    auto e = node(Expr::Kind::call, cur().line);
    e->a = std::move(callee);
    parse_call_args(*e);
    return e;
  }

  // After '|': name(.name)* [(args)]. `subject` null for filter blocks.
  ExprPtr parse_filter(ExprPtr subject) {
    Depth d(*this);
    const int line = cur().line;
    std::string name = expect_name();
    while (skip_op(".")) name += "." + expect_name();
    auto e = node(Expr::Kind::filter, line);
    e->a = std::move(subject);
    e->name = name;
    e->filter = find_filter(name);
    if (!e->filter) {
      if (jinja2_has_filter(name)) fail("filter '" + name + "' is not supported", line);
      fail("No filter named '" + name + "'.", line);
    }
    if (is_op("(")) parse_call_args(*e);
    return e;
  }

  ExprPtr parse_test(ExprPtr subject) {
    Depth d(*this);
    const int line = next().line;  // 'is'
    const bool negated = skip_name("not");
    std::string name = expect_name();
    while (skip_op(".")) name += "." + expect_name();
    auto e = node(Expr::Kind::test, line);
    e->a = std::move(subject);
    e->name = name;
    e->negated = negated;
    e->test = find_test(name);
    if (!e->test) fail("No test named '" + name + "'.", line);
    const Token& t = cur();
    if (t.type == Tok::op && t.text == "(") {
      parse_call_args(*e);
    } else if ((t.type == Tok::name || t.type == Tok::string || t.type == Tok::integer ||
                t.type == Tok::floating ||
                (t.type == Tok::op && (t.text == "(" || t.text == "[" || t.text == "{"))) &&
               !(t.type == Tok::name && (t.text == "else" || t.text == "or" || t.text == "and"))) {
      if (t.type == Tok::name && t.text == "is")
        fail("You cannot chain multiple tests with is", line);
      ExprPtr arg = parse_postfix(parse_primary());
      e->items.push_back(std::move(arg));
    }
    return e;
  }

  std::vector<Token> t_;
  size_t i_ = 0;
  int depth_ = 0;
  int max_depth_;
  int loop_depth_ = 0;
};

}  // namespace

Body parse(std::vector<Token> tokens, int max_depth) {
  return Parser(std::move(tokens), max_depth).parse_template();
}

}  // namespace edgellm::jinja
