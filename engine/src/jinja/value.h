// The values a template computes with, modelled on the Python objects jinja2
// hands around: Undefined, None, bool, int, float, str, list, tuple, dict, a
// namespace(), callables (macros, bound methods, globals) and the loop object.
// Lists and dicts are immutable once built (transformers' sandbox forbids
// mutating them) and shared by pointer, and so are strings; a namespace is the
// one mutable object.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

namespace edgellm::jinja {

struct Value;
class Interp;
struct LoopState;

using List = std::vector<Value>;

// Python dict: insertion-ordered; keys compared with Python equality. Linear
// lookup: the dicts of a chat (messages, tool schemas) have a handful of keys.
struct Dict {
  std::vector<std::pair<Value, Value>> items;
  const Value* find(const Value& key) const;
  const Value* find(std::string_view key) const;
  void set(Value key, Value value);
};

struct Namespace {
  Dict attrs;
};

struct CallArgs {
  std::vector<Value> args;
  std::vector<std::pair<std::string, Value>> kwargs;
};

struct Callable {
  std::string name;
  std::function<Value(Interp&, CallArgs&, int line)> fn;
};

struct Value {
  enum class Type : uint8_t {
    undefined,
    none,
    boolean,
    integer,
    floating,
    string,
    list,
    tuple,
    dict,
    ns,
    callable,
    loop
  };
  Type type = Type::undefined;
  bool b = false;
  // A str jinja2 holds as Markup (|safe, |escape): `+` HTML-escapes a plain str joined to it.
  bool markup = false;
  // A list jinja2 yields lazily (map, select, ...): it has no len(), no index, no JSON.
  bool generator = false;
  // How deeply a list or dict nests (0 for anything else): bounded at
  // Limits::max_depth, so that no walk over a value (repr, ==, tojson, its
  // destructor) recurses without bound.
  uint16_t depth = 0;
  int64_t i = 0;
  double f = 0;
  std::shared_ptr<const List> list;  // list, tuple
  std::shared_ptr<const Dict> dict;
  std::shared_ptr<Namespace> ns;
  std::shared_ptr<const Callable> fn;
  std::shared_ptr<LoopState> loop;

  Value() = default;
  // The string; for undefined: the hint of what was missing; for a generator:
  // the error iterating it raises (a generator over a non-iterable input), if any.
  const std::string& s() const { return text_ ? *text_ : empty_text(); }
  void set_text(std::string text);

  static Value undefined(std::string hint = {}) {
    Value v;
    v.set_text(std::move(hint));
    return v;
  }
  static Value none() { return with_type(Type::none); }
  static Value boolean(bool x) {
    Value v = with_type(Type::boolean);
    v.b = x;
    return v;
  }
  static Value integer(int64_t x) {
    Value v = with_type(Type::integer);
    v.i = x;
    return v;
  }
  static Value floating(double x) {
    Value v = with_type(Type::floating);
    v.f = x;
    return v;
  }
  // The payloads of strings, lists and dicts are charged to the render's
  // budget while they live (jinja/budget.h).
  static Value string(std::string x) {
    Value v = with_type(Type::string);
    v.set_text(std::move(x));
    return v;
  }
  static Value make_list(List items, bool tuple = false);
  static Value make_dict(Dict d);
  static Value function(std::string name, std::function<Value(Interp&, CallArgs&, int)> fn) {
    Value v = with_type(Type::callable);
    v.fn = std::make_shared<const Callable>(Callable{std::move(name), std::move(fn)});
    return v;
  }

  bool is_undefined() const { return type == Type::undefined; }
  bool is_none() const { return type == Type::none; }
  bool is_string() const { return type == Type::string; }
  bool is_int() const { return type == Type::integer || type == Type::boolean; }
  bool is_number() const { return is_int() || type == Type::floating; }
  bool is_sequence() const { return type == Type::list || type == Type::tuple; }
  int64_t as_int() const { return type == Type::boolean ? (b ? 1 : 0) : i; }
  double as_double() const { return type == Type::floating ? f : static_cast<double>(as_int()); }

 private:
  static Value with_type(Type t) {
    Value v;
    v.type = t;
    return v;
  }
  static const std::string& empty_text();
  // Shared by every copy: copying a Value never copies its bytes. Null when empty.
  std::shared_ptr<const std::string> text_;
};

// Python's type name of a value, for error messages ("'int' object ...").
std::string type_name(const Value& v);
bool truthy(const Value& v);
// Python str() and repr().
std::string to_str(const Value& v);
std::string repr(const Value& v);
std::string repr_string(std::string_view s);
// markupsafe's escape: & < > ' " as entities.
std::string html_escape(std::string_view s);
std::string float_repr(double x);
// Python ==.
bool equals(const Value& a, const Value& b);
// Python <: -1, 0, 1; throws (via `fail`) on types Python cannot order.
int compare(const Value& a, const Value& b, int line);

// JSON in (context variables) and out (transformers' tojson: json.dumps with
// ensure_ascii=False).
Value from_json(const nlohmann::ordered_json& j);
struct JsonDumpOptions {
  bool ensure_ascii = false;
  bool sort_keys = false;
  bool has_indent = false;
  std::string indent;  // the string of one level when has_indent
  std::string item_sep = ", ";
  std::string key_sep = ": ";
};
void dump_json(const Value& v, const JsonDumpOptions& o, int level, std::string& out, int line);

}  // namespace edgellm::jinja
