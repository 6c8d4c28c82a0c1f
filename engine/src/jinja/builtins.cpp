// jinja2's default filters and tests (jinja2/filters.py, jinja2/tests.py),
// transformers' globals, and the Python methods of str, dict and list, each
// written to the Python behaviour the differential test holds us to.
#include "jinja/builtins.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>

#include "edgellm/jinja.h"
#include "jinja/budget.h"
#include "jinja/interp.h"
#include "jinja/pystr.h"

namespace edgellm::jinja {

namespace {

using T = Value::Type;

// Positional argument `pos` or keyword `name`; null when neither was passed.
const Value* arg(const CallArgs& a, size_t pos, const char* name) {
  if (pos < a.args.size()) return &a.args[pos];
  for (const auto& [k, v] : a.kwargs)
    if (k == name) return &v;
  return nullptr;
}

bool arg_bool(const CallArgs& a, size_t pos, const char* name, bool dflt) {
  const Value* v = arg(a, pos, name);
  return v ? truthy(*v) : dflt;
}

// jinja2's soft_str: str() of the value (an undefined value is ''). A copy:
// its bytes are work.
std::string soft_str(const Value& v) {
  if (!v.is_string()) return to_str(v);
  charge_work(v.s().size());
  return v.s();
}

const std::string& str_arg(const Value& v, const char* what, int line) {
  if (!v.is_string())
    throw TemplateError(std::string(what) + " must be str, not " + type_name(v), line);
  return v.s();
}

// jinja2's make_attrgetter: "a.b.0" looks up a, then b, then item 0.
Value attr_path(Interp& in, const Value& item, const std::string& path, int line) {
  Value cur = item;
  size_t start = 0;
  while (true) {
    const size_t dot = path.find('.', start);
    const std::string part = path.substr(start, dot == std::string::npos ? dot : dot - start);
    const bool digits = !part.empty() && std::all_of(part.begin(), part.end(),
                                                     [](char c) { return c >= '0' && c <= '9'; });
    cur = get_item(in, cur, digits ? Value::integer(std::stoll(part)) : Value::string(part), line);
    if (dot == std::string::npos) return cur;
    start = dot + 1;
  }
}

// ---- filters ---------------------------------------------------------------

Value f_tojson(Interp&, const Value& v, CallArgs& a, int line) {
  // transformers: json.dumps(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False)
  JsonDumpOptions o;
  o.ensure_ascii = arg_bool(a, 0, "ensure_ascii", false);
  if (const Value* ind = arg(a, 1, "indent"); ind && !ind->is_none()) {
    o.has_indent = true;
    const size_t width = ind->is_string()
                             ? ind->s().size()
                             : static_cast<size_t>(std::max<int64_t>(0, ind->as_int()));
    check_string_size(width);  // before the allocation: indent=1500000000 is refused here
    o.indent = ind->is_string() ? ind->s() : std::string(width, ' ');
    o.item_sep = ",";
  }
  if (const Value* sep = arg(a, 2, "separators"); sep && !sep->is_none()) {
    if (!sep->is_sequence() || sep->list->size() != 2)
      throw TemplateError("tojson: separators must be a pair of strings", line);
    o.item_sep = str_arg((*sep->list)[0], "separator", line);
    o.key_sep = str_arg((*sep->list)[1], "separator", line);
  }
  o.sort_keys = arg_bool(a, 3, "sort_keys", false);
  std::string out;
  dump_json(v, o, 0, out, line);
  return Value::string(std::move(out));
}

Value f_trim(Interp&, const Value& v, CallArgs& a, int line) {
  const Value* chars = arg(a, 0, "chars");
  const std::string* c = chars && !chars->is_none() ? &str_arg(*chars, "strip arg", line) : nullptr;
  return checked_string(pystr::strip(soft_str(v), c, true, true));
}

int64_t py_len(const Value& v, int line) {
  switch (v.type) {
    case T::string:
      return static_cast<int64_t>(pystr::length(v.s()));
    case T::list:
    case T::tuple:
      if (v.generator) throw TemplateError("object of type 'generator' has no len()", line);
      return static_cast<int64_t>(v.list->size());
    case T::dict:
      return static_cast<int64_t>(v.dict->items.size());
    case T::undefined:
      return 0;
    case T::loop:
      return static_cast<int64_t>(v.loop->items->size());
    default:
      throw TemplateError("object of type '" + type_name(v) + "' has no len()", line);
  }
}

Value f_length(Interp&, const Value& v, CallArgs&, int line) {
  return Value::integer(py_len(v, line));
}

Value f_join(Interp& in, const Value& v, CallArgs& a, int line) {
  const Value* d = arg(a, 0, "d");
  const Value* attr = arg(a, 1, "attribute");
  const std::string sep = d ? soft_str(*d) : "";
  std::string out;
  bool first = true;
  const auto iterated1 = iterate(v, line);
  for (const Value& x : *iterated1) {
    if (!first) append_checked(out, sep);
    first = false;
    const Value item = attr && !attr->is_none() ? attr_path(in, x, soft_str(*attr), line) : x;
    append_checked(out, item.is_string() ? item.s() : to_str(item));
  }
  return Value::string(std::move(out));
}

// What jinja2's generator filters (map, select, items, ...) return.
Value generator(List items) {
  Value v = Value::make_list(std::move(items));
  v.generator = true;
  return v;
}

// A generator over a non-iterable input: truthy, printable, and failing with
// `error` once something iterates it, as a Python generator body would.
Value failing_generator(const std::string& error) {
  Value v = generator({});
  v.set_text(error);
  return v;
}

Value f_map(Interp& in, const Value& v, CallArgs& a, int line) {
  List out;
  if (!truthy(v)) return generator({});  // jinja2: `if value:` before iterating
  const Value* attr = nullptr;
  for (const auto& [k, x] : a.kwargs)
    if (k == "attribute") attr = &x;
  if (attr && a.args.empty()) {
    const Value* dflt = nullptr;
    for (const auto& [k, x] : a.kwargs)
      if (k == "default") dflt = &x;
    const auto iterated2 = iterate(v, line);
    for (const Value& x : *iterated2) {
      Value r = attr_path(in, x, soft_str(*attr), line);
      out.push_back(r.is_undefined() && dflt ? *dflt : r);
    }
    return generator(std::move(out));
  }
  if (a.args.empty() || !a.args[0].is_string())
    throw TemplateError("map requires a filter argument", line);
  const FilterFn fn = find_filter(a.args[0].s());
  if (!fn) throw TemplateError("No filter named '" + a.args[0].s() + "'.", line);
  CallArgs rest;
  rest.args.assign(a.args.begin() + 1, a.args.end());
  rest.kwargs = a.kwargs;
  const auto iterated3 = iterate(v, line);
  for (const Value& x : *iterated3) {
    CallArgs copy = rest;
    out.push_back(fn(in, x, copy, line));
  }
  return generator(std::move(out));
}

// select / reject / selectattr / rejectattr: jinja2's select_or_reject.
Value select_or_reject(Interp& in, const Value& v, CallArgs& a, int line, bool attr, bool keep) {
  size_t next = 0;
  std::string path;
  if (attr) {
    if (a.args.empty()) throw TemplateError("selectattr/rejectattr need an attribute name", line);
    path = soft_str(a.args[0]);
    next = 1;
  }
  TestFn test = nullptr;
  CallArgs targs;
  if (next < a.args.size()) {
    const std::string name = soft_str(a.args[next]);
    test = find_test(name);
    if (!test) throw TemplateError("No test named '" + name + "'.", line);
    targs.args.assign(a.args.begin() + next + 1, a.args.end());
    targs.kwargs = a.kwargs;
  }
  List out;
  if (!truthy(v)) return generator({});  // jinja2: `if value:` before iterating
  const auto iterated4 = iterate(v, line);
  for (const Value& x : *iterated4) {
    const Value subject = attr ? attr_path(in, x, path, line) : x;
    bool r;
    if (test) {
      CallArgs copy = targs;
      r = test(in, subject, copy, line);
    } else {
      r = truthy(subject);
    }
    if (r == keep) out.push_back(x);
  }
  return generator(std::move(out));
}

Value f_select(Interp& in, const Value& v, CallArgs& a, int line) {
  return select_or_reject(in, v, a, line, false, true);
}
Value f_reject(Interp& in, const Value& v, CallArgs& a, int line) {
  return select_or_reject(in, v, a, line, false, false);
}
Value f_selectattr(Interp& in, const Value& v, CallArgs& a, int line) {
  return select_or_reject(in, v, a, line, true, true);
}
Value f_rejectattr(Interp& in, const Value& v, CallArgs& a, int line) {
  return select_or_reject(in, v, a, line, true, false);
}

Value f_list(Interp&, const Value& v, CallArgs&, int line) {
  return Value::make_list(*iterate(v, line));
}

Value f_first(Interp&, const Value& v, CallArgs&, int line) {
  const auto items = iterate(v, line);
  if (items->empty()) return Value::undefined("No first item, sequence was empty.");
  return items->front();
}

Value f_last(Interp&, const Value& v, CallArgs&, int line) {
  const auto items = iterate(v, line);
  if (items->empty()) return Value::undefined("No last item, sequence was empty.");
  return items->back();
}

Value f_default(Interp&, const Value& v, CallArgs& a, int) {
  const Value* d = arg(a, 0, "default_value");
  const bool boolean = arg_bool(a, 1, "boolean", false);
  if (v.is_undefined() || (boolean && !truthy(v))) return d ? *d : Value::string("");
  return v;
}

Value f_upper(Interp&, const Value& v, CallArgs&, int) {
  return checked_string(pystr::upper(soft_str(v)));
}
Value f_lower(Interp&, const Value& v, CallArgs&, int) {
  return checked_string(pystr::lower(soft_str(v)));
}
Value f_capitalize(Interp&, const Value& v, CallArgs&, int) {
  return checked_string(pystr::capitalize(soft_str(v)));
}

// jinja2's title is not str.title: words begin after [-\s({\[<]+.
Value f_title(Interp&, const Value& v, CallArgs&, int) {
  const std::u32string s = pystr::decode(soft_str(v));
  std::u32string out;
  bool begin = true;
  for (char32_t c : s) {
    const bool sep = pystr::is_space(c) || c == '-' || c == '(' || c == '{' || c == '[' || c == '<';
    if (sep) {
      out += c;
      begin = true;
    } else if (begin) {
      std::string one;
      pystr::append_utf8(one, c);
      const std::u32string up = pystr::decode(pystr::upper(one));
      out += up;
      begin = false;
    } else {
      std::string one;
      pystr::append_utf8(one, c);
      out += pystr::decode(pystr::lower(one));
    }
  }
  return checked_string(pystr::encode(out));
}

Value f_replace(Interp& in, const Value& v, CallArgs& a, int line) {
  const Value* old = arg(a, 0, "old");
  const Value* repl = arg(a, 1, "new");
  const Value* count = arg(a, 2, "count");
  if (!old || !repl) throw TemplateError("replace needs the old and new strings", line);
  return checked_string(pystr::replace(soft_str(v), soft_str(*old), soft_str(*repl),
                                       count && !count->is_none() ? count->as_int() : -1,
                                       in.opt.limits.max_output));
}

Value f_items(Interp&, const Value& v, CallArgs&, int line) {
  if (v.is_undefined()) return generator({});
  if (v.type != T::dict) throw TemplateError("Can only get item pairs from a mapping.", line);
  List out;
  for (const auto& [k, x] : v.dict->items) out.push_back(Value::make_list({k, x}, true));
  return generator(std::move(out));
}

Value f_string(Interp&, const Value& v, CallArgs&, int) {
  return Value::string(soft_str(v));
}
Value f_safe(Interp&, const Value& v, CallArgs&, int) {
  Value r = Value::string(soft_str(v));
  r.markup = true;
  return r;
}
Value f_escape(Interp&, const Value& v, CallArgs&, int) {
  Value r = Value::string(v.markup ? v.s() : html_escape(soft_str(v)));
  r.markup = true;
  return r;
}

Value f_int(Interp&, const Value& v, CallArgs& a, int) {
  const Value* d = arg(a, 0, "default");
  const Value dflt = d ? *d : Value::integer(0);
  if (v.is_int()) return Value::integer(v.as_int());
  if (v.type == T::floating)
    return std::isfinite(v.f) ? Value::integer(static_cast<int64_t>(v.f)) : dflt;
  if (v.is_string()) {
    const std::string s = pystr::strip(v.s(), nullptr, true, true);
    try {
      size_t used = 0;
      const long long x = std::stoll(s, &used, 10);
      if (used == s.size()) return Value::integer(x);
      const double f = std::stod(s, &used);
      if (used == s.size() && std::isfinite(f)) return Value::integer(static_cast<int64_t>(f));
    } catch (const std::exception&) {
    }
  }
  return dflt;
}

Value f_float(Interp&, const Value& v, CallArgs& a, int) {
  const Value* d = arg(a, 0, "default");
  const Value dflt = d ? *d : Value::floating(0.0);
  if (v.is_number()) return Value::floating(v.as_double());
  if (v.is_string()) {
    const std::string s = pystr::strip(v.s(), nullptr, true, true);
    try {
      size_t used = 0;
      const double f = std::stod(s, &used);
      if (used == s.size()) return Value::floating(f);
    } catch (const std::exception&) {
    }
  }
  return dflt;
}

Value f_abs(Interp&, const Value& v, CallArgs&, int line) {
  if (v.type == T::floating) return Value::floating(std::fabs(v.f));
  if (!v.is_int()) throw TemplateError("bad operand type for abs(): '" + type_name(v) + "'", line);
  if (v.as_int() == INT64_MIN) throw TemplateError("integer overflow (beyond 64 bits)", line);
  return Value::integer(std::llabs(v.as_int()));
}

Value f_reverse(Interp&, const Value& v, CallArgs&, int line) {
  if (v.is_string()) {
    std::u32string u = pystr::decode(v.s());
    std::reverse(u.begin(), u.end());
    return Value::string(pystr::encode(u));
  }
  List items = *iterate(v, line);
  std::reverse(items.begin(), items.end());
  // reversed() of a list, tuple or dict is an iterator (no len, no index); a
  // generator cannot be reversed(), so jinja2 falls back to a list.
  return v.generator ? Value::make_list(std::move(items)) : generator(std::move(items));
}

// The sort key of jinja2's ignore_case: strings lowered unless case_sensitive.
Value sort_key(const Value& v, bool case_sensitive) {
  return !case_sensitive && v.is_string() ? Value::string(pystr::lower(v.s())) : v;
}

Value f_sort(Interp& in, const Value& v, CallArgs& a, int line) {
  const bool reverse = arg_bool(a, 0, "reverse", false);
  const bool cs = arg_bool(a, 1, "case_sensitive", false);
  const Value* attr = arg(a, 2, "attribute");
  List items = *iterate(v, line);
  std::vector<std::pair<Value, size_t>> keys;
  for (size_t k = 0; k < items.size(); ++k)
    keys.emplace_back(
        sort_key(
            attr && !attr->is_none() ? attr_path(in, items[k], soft_str(*attr), line) : items[k],
            cs),
        k);
  std::stable_sort(keys.begin(), keys.end(), [&](const auto& x, const auto& y) {
    return reverse ? compare(y.first, x.first, line) < 0 : compare(x.first, y.first, line) < 0;
  });
  List out;
  for (const auto& kv : keys) out.push_back(items[kv.second]);
  return Value::make_list(std::move(out));
}

Value f_dictsort(Interp&, const Value& v, CallArgs& a, int line) {
  if (v.type != T::dict) throw TemplateError("You can only sort by either 'key' or 'value'", line);
  const bool cs = arg_bool(a, 0, "case_sensitive", false);
  const Value* by = arg(a, 1, "by");
  const bool by_value = by && by->is_string() && by->s() == "value";
  const bool reverse = arg_bool(a, 2, "reverse", false);
  List out;
  for (const auto& [k, x] : v.dict->items) out.push_back(Value::make_list({k, x}, true));
  std::stable_sort(out.begin(), out.end(), [&](const Value& p, const Value& q) {
    const Value kp = sort_key((*p.list)[by_value ? 1 : 0], cs);
    const Value kq = sort_key((*q.list)[by_value ? 1 : 0], cs);
    return reverse ? compare(kq, kp, line) < 0 : compare(kp, kq, line) < 0;
  });
  return Value::make_list(std::move(out));
}

Value f_unique(Interp& in, const Value& v, CallArgs& a, int line) {
  const bool cs = arg_bool(a, 0, "case_sensitive", false);
  const Value* attr = arg(a, 1, "attribute");
  List out, seen;
  std::shared_ptr<const List> iterated5;
  try {
    iterated5 = iterate(v, line);
  } catch (const TemplateError& e) {
    return failing_generator(e.detail());  // jinja2's unique fails only when iterated
  }
  for (const Value& x : *iterated5) {
    const Value key =
        sort_key(attr && !attr->is_none() ? attr_path(in, x, soft_str(*attr), line) : x, cs);
    bool dup = false;
    for (const Value& s : seen)
      if (equals(s, key)) dup = true;
    if (dup) continue;
    seen.push_back(key);
    out.push_back(x);
  }
  return generator(std::move(out));
}

// jinja2's format filter: the string % the positional arguments (as a tuple),
// or % the keyword arguments (as a dict), not both.
Value f_format(Interp&, const Value& v, CallArgs& a, int line) {
  if (!a.args.empty() && !a.kwargs.empty())
    throw TemplateError("can't handle positional and keyword arguments at the same time", line);
  Value args;
  if (!a.kwargs.empty()) {
    Dict d;
    for (const auto& [k, x] : a.kwargs) d.items.push_back({Value::string(k), x});
    args = Value::make_dict(std::move(d));
  } else {
    args = Value::make_list(a.args, /*tuple=*/true);
  }
  return percent_format(Value::string(to_str(v)), args, line);
}

Value f_indent(Interp& in, const Value& v, CallArgs& a, int line) {
  const Value* w = arg(a, 0, "width");
  std::string ind = "    ";
  if (w) {
    const size_t width =
        w->is_string() ? w->s().size() : static_cast<size_t>(std::max<int64_t>(0, w->as_int()));
    check_string_size(width);  // before the allocation: indent(1500000000) is refused here
    ind = w->is_string() ? w->s() : std::string(width, ' ');
  }
  const bool first = arg_bool(a, 1, "first", false);
  const bool blank = arg_bool(a, 2, "blank", false);
  // jinja2's indent appends "\n" with +=, so only a string gets through.
  if (!v.is_string())
    throw TemplateError("unsupported operand type(s) for +=: '" + type_name(v) + "' and 'str'",
                        line);
  const std::vector<std::string> lines =
      pystr::splitlines(soft_str(v) + "\n", false, parts_allowed());
  check_alloc_size(mul_sat(lines.size(), sizeof(std::string)));
  std::string rv;
  if (first) append_checked(rv, ind);
  for (size_t k = 0; k < lines.size(); ++k) {
    if (k) append_checked(rv, "\n");
    if (k && (blank || !lines[k].empty())) append_checked(rv, ind);
    append_checked(rv, lines[k]);
  }
  return Value::string(std::move(rv));
}

Value f_sum(Interp& in, const Value& v, CallArgs& a, int line) {
  const Value* attr = arg(a, 0, "attribute");
  const Value* start = arg(a, 1, "start");
  Value total = start ? *start : Value::integer(0);
  const auto iterated6 = iterate(v, line);
  for (const Value& x : *iterated6) {
    const Value item = attr && !attr->is_none() ? attr_path(in, x, soft_str(*attr), line) : x;
    if (!total.is_number() || !item.is_number())
      throw TemplateError("unsupported operand type(s) for +: '" + type_name(total) + "' and '" +
                              type_name(item) + "'",
                          line);
    if (total.is_int() && item.is_int()) {
      int64_t r;
      if (__builtin_add_overflow(total.as_int(), item.as_int(), &r))
        throw TemplateError("integer overflow (beyond 64 bits)", line);
      total = Value::integer(r);
    } else {
      total = Value::floating(total.as_double() + item.as_double());
    }
  }
  return total;
}

Value min_max(Interp& in, const Value& v, CallArgs& a, int line, bool want_max) {
  const bool cs = arg_bool(a, 0, "case_sensitive", false);
  const Value* attr = arg(a, 1, "attribute");
  const auto items = iterate(v, line);
  if (items->empty()) return Value::undefined("No aggregated item, sequence was empty.");
  const Value* best = nullptr;
  Value best_key;
  for (const Value& x : *items) {
    const Value key =
        sort_key(attr && !attr->is_none() ? attr_path(in, x, soft_str(*attr), line) : x, cs);
    if (!best || (want_max ? compare(key, best_key, line) > 0 : compare(key, best_key, line) < 0)) {
      best = &x;
      best_key = key;
    }
  }
  return *best;
}
Value f_min(Interp& in, const Value& v, CallArgs& a, int line) {
  return min_max(in, v, a, line, false);
}
Value f_max(Interp& in, const Value& v, CallArgs& a, int line) {
  return min_max(in, v, a, line, true);
}

struct NamedFilter {
  const char* name;
  FilterFn fn;
};
constexpr NamedFilter kFilters[] = {
    {"tojson", f_tojson},
    {"trim", f_trim},
    {"length", f_length},
    {"count", f_length},
    {"join", f_join},
    {"map", f_map},
    {"select", f_select},
    {"reject", f_reject},
    {"selectattr", f_selectattr},
    {"rejectattr", f_rejectattr},
    {"list", f_list},
    {"first", f_first},
    {"last", f_last},
    {"default", f_default},
    {"d", f_default},
    {"upper", f_upper},
    {"lower", f_lower},
    {"capitalize", f_capitalize},
    {"title", f_title},
    {"replace", f_replace},
    {"items", f_items},
    {"string", f_string},
    {"safe", f_safe},
    {"int", f_int},
    {"float", f_float},
    {"abs", f_abs},
    {"reverse", f_reverse},
    {"sort", f_sort},
    {"dictsort", f_dictsort},
    {"unique", f_unique},
    {"indent", f_indent},
    {"format", f_format},
    {"sum", f_sum},
    {"min", f_min},
    {"max", f_max},
    {"escape", f_escape},
    {"e", f_escape},
};

// ---- tests -----------------------------------------------------------------

const Value& test_arg(const CallArgs& a, const char* test, int line) {
  if (a.args.empty())
    throw TemplateError("test '" + std::string(test) + "' needs an argument", line);
  return a.args[0];
}

bool t_defined(Interp&, const Value& v, CallArgs&, int) {
  return !v.is_undefined();
}
bool t_undefined(Interp&, const Value& v, CallArgs&, int) {
  return v.is_undefined();
}
bool t_none(Interp&, const Value& v, CallArgs&, int) {
  return v.is_none();
}
bool t_string(Interp&, const Value& v, CallArgs&, int) {
  return v.is_string();
}
bool t_mapping(Interp&, const Value& v, CallArgs&, int) {
  return v.type == T::dict;
}
bool t_iterable(Interp&, const Value& v, CallArgs&, int) {
  return v.is_string() || v.is_sequence() || v.type == T::dict || v.is_undefined() ||
         v.type == T::loop;
}
bool t_sequence(Interp&, const Value& v, CallArgs&, int) {
  return v.is_string() || v.is_sequence() || v.type == T::dict || v.is_undefined();
}
bool t_number(Interp&, const Value& v, CallArgs&, int) {
  return v.is_number();
}
bool t_integer(Interp&, const Value& v, CallArgs&, int) {
  return v.type == T::integer;
}
bool t_float(Interp&, const Value& v, CallArgs&, int) {
  return v.type == T::floating;
}
bool t_boolean(Interp&, const Value& v, CallArgs&, int) {
  return v.type == T::boolean;
}
bool t_true(Interp&, const Value& v, CallArgs&, int) {
  return v.type == T::boolean && v.b;
}
bool t_false(Interp&, const Value& v, CallArgs&, int) {
  return v.type == T::boolean && !v.b;
}
bool t_callable(Interp&, const Value& v, CallArgs&, int) {
  return v.type == T::callable;
}
bool t_eq(Interp&, const Value& v, CallArgs& a, int line) {
  return equals(v, test_arg(a, "eq", line));
}
bool t_ne(Interp&, const Value& v, CallArgs& a, int line) {
  return !equals(v, test_arg(a, "ne", line));
}
bool t_lt(Interp&, const Value& v, CallArgs& a, int line) {
  return compare(v, test_arg(a, "lt", line), line) < 0;
}
bool t_le(Interp&, const Value& v, CallArgs& a, int line) {
  return compare(v, test_arg(a, "le", line), line) <= 0;
}
bool t_gt(Interp&, const Value& v, CallArgs& a, int line) {
  return compare(v, test_arg(a, "gt", line), line) > 0;
}
bool t_ge(Interp&, const Value& v, CallArgs& a, int line) {
  return compare(v, test_arg(a, "ge", line), line) >= 0;
}
bool t_in(Interp&, const Value& v, CallArgs& a, int line) {
  return contains(test_arg(a, "in", line), v, line);
}
bool t_sameas(Interp&, const Value& v, CallArgs& a, int line) {
  const Value& o = test_arg(a, "sameas", line);
  if (v.type != o.type) return false;
  switch (v.type) {
    case T::none:
    case T::undefined:
      return true;
    case T::boolean:
      return v.b == o.b;
    case T::list:
    case T::tuple:
      return v.list == o.list;
    case T::dict:
      return v.dict == o.dict;
    case T::ns:
      return v.ns == o.ns;
    default:
      return false;  // Python identity of other values is an implementation detail
  }
}
int64_t int_operand(const Value& v, const char* test, int line) {
  if (!v.is_int()) throw TemplateError("test '" + std::string(test) + "' needs an integer", line);
  return v.as_int();
}
bool t_odd(Interp&, const Value& v, CallArgs&, int line) {
  return int_operand(v, "odd", line) % 2 != 0;
}
bool t_even(Interp&, const Value& v, CallArgs&, int line) {
  return int_operand(v, "even", line) % 2 == 0;
}
bool t_divisibleby(Interp&, const Value& v, CallArgs& a, int line) {
  const int64_t d = int_operand(test_arg(a, "divisibleby", line), "divisibleby", line);
  if (d == 0) throw TemplateError("integer division or modulo by zero", line);
  return d == -1 || int_operand(v, "divisibleby", line) % d == 0;
}
bool t_lower(Interp&, const Value& v, CallArgs&, int) {
  const std::string s = soft_str(v);
  return s == pystr::lower(s) && s != pystr::upper(s);
}
bool t_upper(Interp&, const Value& v, CallArgs&, int) {
  const std::string s = soft_str(v);
  return s == pystr::upper(s) && s != pystr::lower(s);
}
bool t_filter(Interp&, const Value& v, CallArgs&, int) {
  return v.is_string() && find_filter(v.s()) != nullptr;
}
bool t_test(Interp&, const Value& v, CallArgs&, int) {
  return v.is_string() && find_test(v.s()) != nullptr;
}

struct NamedTest {
  const char* name;
  TestFn fn;
};
constexpr NamedTest kTests[] = {
    {"defined", t_defined},
    {"undefined", t_undefined},
    {"none", t_none},
    {"string", t_string},
    {"mapping", t_mapping},
    {"iterable", t_iterable},
    {"sequence", t_sequence},
    {"number", t_number},
    {"integer", t_integer},
    {"float", t_float},
    {"boolean", t_boolean},
    {"true", t_true},
    {"false", t_false},
    {"callable", t_callable},
    {"eq", t_eq},
    {"equalto", t_eq},
    {"ne", t_ne},
    {"lt", t_lt},
    {"lessthan", t_lt},
    {"le", t_le},
    {"gt", t_gt},
    {"greaterthan", t_gt},
    {"ge", t_ge},
    {"in", t_in},
    {"sameas", t_sameas},
    {"odd", t_odd},
    {"even", t_even},
    {"divisibleby", t_divisibleby},
    {"lower", t_lower},
    {"upper", t_upper},
    {"filter", t_filter},
    {"test", t_test},
};

// ---- globals ---------------------------------------------------------------

Value g_range(Interp& in, CallArgs& a, int line) {
  for (const Value& v : a.args)
    if (!v.is_int())
      throw TemplateError("'" + type_name(v) + "' object cannot be interpreted as an integer",
                          line);
  int64_t start = 0, stop = 0, step = 1;
  if (a.args.size() == 1) {
    stop = a.args[0].as_int();
  } else if (a.args.size() == 2 || a.args.size() == 3) {
    start = a.args[0].as_int();
    stop = a.args[1].as_int();
    if (a.args.size() == 3) step = a.args[2].as_int();
  } else {
    throw TemplateError("range expected 1 to 3 arguments, got " + std::to_string(a.args.size()),
                        line);
  }
  if (step == 0) throw TemplateError("range() arg 3 must not be zero", line);
  List out;
  // The sandbox refuses ranges over MAX_RANGE (100000) items.
  const __int128 span = step > 0 ? static_cast<__int128>(stop) - start + step - 1
                                 : static_cast<__int128>(start) - stop - step - 1;
  const __int128 n = span > 0 ? span / (step > 0 ? step : -static_cast<__int128>(step)) : 0;
  if (n > 100000)
    throw TemplateError("Range too big. The sandbox blocks ranges larger than MAX_RANGE (100000).",
                        line);
  check_alloc_size(static_cast<size_t>(n) * sizeof(Value));
  for (int64_t k = 0; k < static_cast<int64_t>(n); ++k)
    out.push_back(Value::integer(start + k * step));
  in.step(line);
  return Value::make_list(std::move(out));
}

Value g_namespace(Interp& in, CallArgs& a, int line) {
  Value v;
  v.type = T::ns;
  v.ns = in.new_namespace();
  for (const Value& x : a.args) {
    if (x.type != T::dict)
      throw TemplateError("namespace() takes mappings or keyword arguments", line);
    for (const auto& [k, y] : x.dict->items) v.ns->attrs.set(k, y);
  }
  for (const auto& [k, y] : a.kwargs) v.ns->attrs.set(Value::string(k), y);
  return v;
}

Value g_dict(Interp&, CallArgs& a, int line) {
  Dict d;
  for (const Value& x : a.args) {
    if (x.type != T::dict) throw TemplateError("dict() takes a mapping or keyword arguments", line);
    for (const auto& [k, y] : x.dict->items) d.set(k, y);
  }
  for (const auto& [k, y] : a.kwargs) d.set(Value::string(k), y);
  return Value::make_dict(std::move(d));
}

Value g_raise_exception(Interp&, CallArgs& a, int line) {
  throw RaisedError(a.args.empty() ? "" : soft_str(a.args[0]), line);
}

Value g_strftime_now(Interp& in, CallArgs& a, int line) {
  if (a.args.empty() || !a.args[0].is_string())
    throw TemplateError("strftime_now needs a format string", line);
  const std::time_t t = in.now();
  std::tm tm{};
  if (in.utc())
    gmtime_r(&t, &tm);
  else
    localtime_r(&t, &tm);
  const std::string& fmt = a.args[0].s();
  if (fmt.size() > 256) throw TemplateError("strftime_now: format too long", line);
  std::string buf(fmt.size() * 16 + 64, '\0');
  const size_t n = std::strftime(buf.data(), buf.size(), fmt.c_str(), &tm);
  buf.resize(n);
  return Value::string(std::move(buf));
}

Value g_joiner(Interp&, CallArgs& a, int) {
  const std::string sep = a.args.empty() ? ", " : soft_str(a.args[0]);
  auto used = std::make_shared<bool>(false);
  return Value::function("joiner", [sep, used](Interp&, CallArgs&, int) {
    if (!*used) {
      *used = true;
      return Value::string("");
    }
    return Value::string(sep);
  });
}

struct NamedGlobal {
  const char* name;
  Value (*fn)(Interp&, CallArgs&, int);
};
constexpr NamedGlobal kGlobals[] = {
    {"range", g_range},
    {"namespace", g_namespace},
    {"dict", g_dict},
    {"raise_exception", g_raise_exception},
    {"strftime_now", g_strftime_now},
    {"joiner", g_joiner},
};

// ---- attributes and methods ------------------------------------------------

std::string object_repr(const Value& v) {
  return v.is_none() ? "None" : type_name(v) + " object";
}

Value missing_attr(const Value& obj, const std::string& name) {
  if (obj.is_none()) return Value::undefined("'None' has no attribute '" + name + "'");
  return Value::undefined("'" + object_repr(obj) + "' has no attribute '" + name + "'");
}

bool is_str_method(std::string_view n) {
  static const char* names[] = {
      "strip",    "lstrip",  "rstrip",  "split", "rsplit",  "splitlines", "startswith",
      "endswith", "replace", "upper",   "lower", "title",   "capitalize", "swapcase",
      "find",     "rfind",   "count",   "join",  "isdigit", "isalpha",    "isspace",
      "isupper",  "islower", "isalnum", "index", "rindex"};
  for (const char* m : names)
    if (n == m) return true;
  return false;
}
bool is_dict_method(std::string_view n) {
  return n == "get" || n == "items" || n == "keys" || n == "values";
}
bool is_list_method(std::string_view n) {
  return n == "index" || n == "count";
}
// Methods that exist but the immutable sandbox refuses to call.
bool is_mutating(const Value& obj, std::string_view n) {
  static const char* list_m[] = {"append", "extend", "insert", "pop",
                                 "remove", "clear",  "sort",   "reverse"};
  static const char* dict_m[] = {"pop", "popitem", "setdefault", "update", "clear"};
  if (obj.type == T::list) {
    for (const char* m : list_m)
      if (n == m) return true;
  } else if (obj.type == T::dict) {
    for (const char* m : dict_m)
      if (n == m) return true;
  }
  return false;
}

bool has_method(const Value& obj, std::string_view n) {
  switch (obj.type) {
    case T::string:
      return is_str_method(n) || n == "format";
    case T::dict:
      return is_dict_method(n) || is_mutating(obj, n);
    case T::list:
      return is_list_method(n) || is_mutating(obj, n);
    case T::tuple:
      return is_list_method(n);
    default:
      return false;
  }
}

Value bound_method(const Value& obj, const std::string& name) {
  return Value::function(name, [obj, name](Interp& in, CallArgs& args, int line) {
    Value r;
    call_method(in, obj, name, args, line, r);
    return r;
  });
}

Value loop_attr(const LoopState& l, const std::string& name) {
  const int64_t n = static_cast<int64_t>(l.items->size());
  const int64_t i = l.index0;
  if (name == "index") return Value::integer(i + 1);
  if (name == "index0") return Value::integer(i);
  if (name == "revindex") return Value::integer(n - i);
  if (name == "revindex0") return Value::integer(n - i - 1);
  if (name == "first") return Value::boolean(i == 0);
  if (name == "last") return Value::boolean(l.last_off_by_one ? i + 2 == n : i + 1 == n);
  if (name == "length") return Value::integer(n);
  if (name == "depth") return Value::integer(1);
  if (name == "depth0") return Value::integer(0);
  if (name == "previtem")
    return i > 0 ? (*l.items)[i - 1] : Value::undefined("there is no previous item");
  if (name == "nextitem")
    return i + 1 < n ? (*l.items)[i + 1] : Value::undefined("there is no next item");
  return Value::undefined("'LoopContext' object has no attribute '" + name + "'");
}

const std::string& str_of(const Value& v, const char* what, int line) {
  return str_arg(v, what, line);
}

// str.startswith / endswith: a prefix or a tuple of them.
bool affix(const std::string& s, const Value& a, bool start, int line) {
  auto one = [&](const Value& p) {
    const std::string& x = str_of(p, start ? "startswith arg" : "endswith arg", line);
    if (x.size() > s.size()) return false;
    return start ? s.compare(0, x.size(), x) == 0
                 : s.compare(s.size() - x.size(), x.size(), x) == 0;
  };
  if (a.type == T::tuple) {
    for (const Value& p : *a.list)
      if (one(p)) return true;
    return false;
  }
  return one(a);
}

template <class Pred>
bool all_chars(const std::string& s, Pred p) {
  const std::u32string u = pystr::decode(s);
  if (u.empty()) return false;
  return std::all_of(u.begin(), u.end(), p);
}

bool str_method(Interp& in, const std::string& s, const std::string& name, CallArgs& a, int line,
                Value& r) {
  auto opt_str = [&](size_t pos, const char* kw) -> const std::string* {
    const Value* v = arg(a, pos, kw);
    if (!v || v->is_none()) return nullptr;
    return &str_of(*v, (name + " arg").c_str(), line);
  };
  auto opt_int = [&](size_t pos, const char* kw, int64_t dflt) {
    const Value* v = arg(a, pos, kw);
    if (!v || v->is_none()) return dflt;
    if (!v->is_int()) throw TemplateError(name + ": an integer is required", line);
    return v->as_int();
  };
  if (name == "strip" || name == "lstrip" || name == "rstrip") {
    r = checked_string(pystr::strip(s, opt_str(0, "chars"), name != "rstrip", name != "lstrip"));
  } else if (name == "split" || name == "rsplit") {
    const std::string* sep = opt_str(0, "sep");
    if (sep && sep->empty()) throw TemplateError("empty separator", line);
    const int64_t maxsplit = opt_int(1, "maxsplit", -1);
    r = checked_parts(name == "split" ? pystr::split(s, sep, maxsplit, parts_allowed())
                                      : pystr::rsplit(s, sep, maxsplit, parts_allowed()));
  } else if (name == "splitlines") {
    r = checked_parts(pystr::splitlines(s, arg_bool(a, 0, "keepends", false), parts_allowed()));
  } else if (name == "startswith" || name == "endswith") {
    const Value* p = arg(a, 0, "prefix");
    if (!p) throw TemplateError(name + "() takes at least 1 argument (0 given)", line);
    r = Value::boolean(affix(s, *p, name == "startswith", line));
  } else if (name == "replace") {
    const std::string* old = opt_str(0, "old");
    const std::string* repl = opt_str(1, "new");
    if (!old || !repl) throw TemplateError("replace expected at least 2 arguments", line);
    r = checked_string(
        pystr::replace(s, *old, *repl, opt_int(2, "count", -1), in.opt.limits.max_output));
  } else if (name == "upper") {
    r = checked_string(pystr::upper(s));
  } else if (name == "lower") {
    r = checked_string(pystr::lower(s));
  } else if (name == "title") {
    r = checked_string(pystr::title(s));
  } else if (name == "capitalize") {
    r = checked_string(pystr::capitalize(s));
  } else if (name == "swapcase") {
    r = checked_string(pystr::swapcase(s));
  } else if (name == "find" || name == "rfind" || name == "index" || name == "rindex") {
    const std::string* sub = opt_str(0, "sub");
    if (!sub) throw TemplateError(name + " expected at least 1 argument", line);
    const int64_t n = static_cast<int64_t>(pystr::length(s));
    const int64_t k =
        pystr::find(s, *sub, opt_int(1, "start", 0), opt_int(2, "end", n), name[0] == 'r');
    if (k < 0 && name.find("index") != std::string::npos)
      throw TemplateError("substring not found", line);
    r = Value::integer(k);
  } else if (name == "count") {
    const std::string* sub = opt_str(0, "sub");
    if (!sub) throw TemplateError("count expected at least 1 argument", line);
    const int64_t n = static_cast<int64_t>(pystr::length(s));
    r = Value::integer(pystr::count(s, *sub, opt_int(1, "start", 0), opt_int(2, "end", n)));
  } else if (name == "join") {
    const Value* items = arg(a, 0, "iterable");
    if (!items) throw TemplateError("join() takes exactly one argument (0 given)", line);
    std::string out;
    bool first = true;
    const auto iterated7 = iterate(*items, line);
    for (const Value& x : *iterated7) {
      if (!x.is_string())
        throw TemplateError("sequence item: expected str instance, " + type_name(x) + " found",
                            line);
      if (!first) append_checked(out, s);
      first = false;
      append_checked(out, x.s());
    }
    r = Value::string(std::move(out));
  } else if (name == "isdigit") {
    r = Value::boolean(all_chars(s, pystr::is_digit));
  } else if (name == "isalpha") {
    r = Value::boolean(all_chars(s, pystr::is_alpha));
  } else if (name == "isalnum") {
    r = Value::boolean(
        all_chars(s, [](char32_t c) { return pystr::is_alpha(c) || pystr::is_digit(c); }));
  } else if (name == "isspace") {
    r = Value::boolean(all_chars(s, pystr::is_space));
  } else if (name == "isupper" || name == "islower") {
    const bool up = name == "isupper";
    bool cased = false, ok = true;
    for (char32_t c : pystr::decode(s)) {
      if (up ? pystr::is_lower(c) : pystr::is_upper(c)) ok = false;
      if (up ? pystr::is_upper(c) : pystr::is_lower(c)) cased = true;
    }
    r = Value::boolean(ok && cased);
  } else if (name == "format") {
    throw TemplateError("str.format is not supported", line);
  } else {
    return false;
  }
  return true;
}

}  // namespace

Value percent_format(const Value& format, const Value& args, int line) {
  // Python's rule: a tuple is the argument list; any other value is the one
  // argument, and one with a subscript (dict, list) is also the mapping of
  // %(name)s, which excuses it from "not all arguments converted".
  const bool is_tuple = args.type == T::tuple;
  const bool mapping = !is_tuple && (args.type == T::dict || args.type == T::list);
  const List single = {args};
  const List& items = is_tuple ? *args.list : single;
  size_t next = 0;
  const std::string& f = format.s();
  std::string out;
  auto fail = [&](const std::string& why) -> void { throw TemplateError(why, line); };
  for (size_t i = 0; i < f.size(); ++i) {
    if (f[i] != '%') {
      out += f[i];
      continue;
    }
    if (++i == f.size()) fail("incomplete format");
    const Value* value = nullptr;
    if (f[i] == '(') {
      const size_t close = f.find(')', i);
      if (close == std::string::npos) fail("incomplete format key");
      if (args.type != T::dict) fail("format requires a mapping");
      const std::string key = f.substr(i + 1, close - i - 1);
      value = args.dict->find(key);
      if (!value) fail("KeyError: " + repr_string(key));
      i = close + 1;
    }
    bool left = false, zero = false;
    for (; i < f.size() && (f[i] == '-' || f[i] == '0' || f[i] == ' ' || f[i] == '+'); ++i) {
      left = left || f[i] == '-';
      zero = zero || f[i] == '0';
      if (f[i] == ' ' || f[i] == '+')
        fail("format flag '" + std::string(1, f[i]) + "' is not supported");
    }
    size_t width = 0;
    for (; i < f.size() && std::isdigit(static_cast<unsigned char>(f[i])); ++i)
      width = std::min<size_t>(width * 10 + static_cast<size_t>(f[i] - '0'), 1u << 20);
    int precision = -1;
    if (i < f.size() && f[i] == '.') {
      precision = 0;
      for (++i; i < f.size() && std::isdigit(static_cast<unsigned char>(f[i])); ++i)
        precision = std::min(precision * 10 + (f[i] - '0'), 1 << 10);
    }
    if (i == f.size()) fail("incomplete format");
    const char conv = f[i];
    if (conv == '%') {
      out += '%';
      continue;
    }
    if (!value) {
      if (next >= items.size()) fail("not enough arguments for format string");
      value = &items[next++];
    }
    std::string text;
    switch (conv) {
      case 's':
      case 'r':
        text = conv == 's' ? to_str(*value) : repr(*value);
        if (precision >= 0) text = pystr::encode(pystr::decode(text).substr(0, precision));
        break;
      case 'd':
      case 'i':
        if (!value->is_number())
          fail("%" + std::string(1, conv) + " format: a real number is required, not " +
               type_name(*value));
        text = std::to_string(value->type == T::floating ? static_cast<int64_t>(value->f)
                                                         : value->as_int());
        break;
      case 'x':
      case 'X':
      case 'o': {
        if (!value->is_int())
          fail("%" + std::string(1, conv) + " format: an integer is required, not " +
               type_name(*value));
        const int64_t n = value->as_int();
        const uint64_t mag = n < 0 ? 0 - static_cast<uint64_t>(n) : static_cast<uint64_t>(n);
        char buf[32];
        std::snprintf(buf, sizeof(buf),
                      conv == 'x'   ? "%llx"
                      : conv == 'X' ? "%llX"
                                    : "%llo",
                      static_cast<unsigned long long>(mag));
        text = (n < 0 ? "-" : "") + std::string(buf);
        break;
      }
      case 'f': {
        if (!value->is_number()) fail("must be real number, not " + type_name(*value));
        char buf[512];
        std::snprintf(buf, sizeof(buf), "%.*f", precision < 0 ? 6 : std::min(precision, 100),
                      value->as_double());
        text = buf;
        break;
      }
      default:
        fail("string formatting with %" + std::string(1, conv) + " is not supported");
    }
    const size_t len = pystr::length(text);
    if (len < width) {
      const std::string pad(width - len, zero && !left && conv != 's' && conv != 'r' ? '0' : ' ');
      if (left) {
        text += pad;
      } else if (pad[0] == '0' && !text.empty() && text[0] == '-') {
        text = "-" + pad + text.substr(1);
      } else {
        text = pad + text;
      }
    }
    append_checked(out, text);
  }
  if (next < items.size() && !mapping && (is_tuple || next == 0))
    fail("not all arguments converted during string formatting");
  return Value::string(std::move(out));
}

FilterFn find_filter(std::string_view name) {
  for (const auto& f : kFilters)
    if (name == f.name) return f.fn;
  return nullptr;
}

TestFn find_test(std::string_view name) {
  for (const auto& t : kTests)
    if (name == t.name) return t.fn;
  return nullptr;
}

bool jinja2_has_filter(std::string_view name) {
  static const char* all[] = {
      "abs",       "attr",       "batch",       "capitalize", "center",  "count",
      "d",         "default",    "dictsort",    "e",          "escape",  "filesizeformat",
      "first",     "float",      "forceescape", "format",     "groupby", "indent",
      "int",       "join",       "last",        "length",     "list",    "lower",
      "items",     "map",        "min",         "max",        "pprint",  "random",
      "reject",    "rejectattr", "replace",     "reverse",    "round",   "safe",
      "select",    "selectattr", "slice",       "sort",       "string",  "striptags",
      "sum",       "title",      "trim",        "truncate",   "unique",  "upper",
      "urlencode", "urlize",     "wordcount",   "wordwrap",   "xmlattr", "tojson"};
  for (const char* f : all)
    if (name == f) return true;
  return false;
}

Value global(std::string_view name) {
  for (const auto& g : kGlobals)
    if (name == g.name) return Value::function(g.name, g.fn);
  return Value::undefined();
}

Value get_attr(Interp& in, const Value& obj, const std::string& name, int line) {
  if (obj.is_undefined()) undefined_error(obj, line);
  if (!name.empty() && name[0] == '_')
    return Value::undefined("access to attribute '" + name + "' of '" + type_name(obj) +
                            "' object is unsafe.");
  switch (obj.type) {
    case T::dict:
      if (has_method(obj, name)) return bound_method(obj, name);
      if (const Value* v = obj.dict->find(std::string_view(name))) return *v;
      return missing_attr(obj, name);
    case T::ns:
      if (const Value* v = obj.ns->attrs.find(std::string_view(name))) return *v;
      return Value::undefined("'Namespace' object has no attribute '" + name + "'");
    case T::loop:
      if (name == "cycle") {
        const auto state = obj.loop;
        return Value::function("cycle", [state](Interp&, CallArgs& a, int l) {
          if (a.args.empty()) throw TemplateError("no items for cycling given", l);
          return a.args[static_cast<size_t>(state->index0) % a.args.size()];
        });
      }
      return loop_attr(*obj.loop, name);
    default:
      if (has_method(obj, name)) return bound_method(obj, name);
      return missing_attr(obj, name);
  }
}

Value get_item(Interp& in, const Value& obj, const Value& key, int line) {
  if (obj.is_undefined()) undefined_error(obj, line);
  if (obj.generator) throw TemplateError("'generator' object is not subscriptable", line);
  switch (obj.type) {
    case T::list:
    case T::tuple:
    case T::string:
      if (key.is_int()) {
        const bool str = obj.is_string();
        if (str && !pystr::is_ascii(obj.s())) {
          const std::u32string u = pystr::decode(obj.s());
          int64_t k = key.as_int();
          const int64_t n = static_cast<int64_t>(u.size());
          if (k < 0) k += n;
          if (k < 0 || k >= n) break;
          std::string ch;
          pystr::append_utf8(ch, u[k]);
          return Value::string(std::move(ch));
        }
        const int64_t n = static_cast<int64_t>(str ? obj.s().size() : obj.list->size());
        int64_t k = key.as_int();
        if (k < 0) k += n;
        if (k < 0 || k >= n) break;
        return str ? Value::string(std::string(1, obj.s()[k])) : (*obj.list)[k];
      }
      break;
    case T::dict:
      if (const Value* v = obj.dict->find(key)) return *v;
      break;
    case T::ns:
    case T::loop:
      break;
    default:
      break;
  }
  if (key.is_string()) {
    if (obj.type == T::dict) {
      if (has_method(obj, key.s())) return bound_method(obj, key.s());
      return missing_attr(obj, key.s());
    }
    return get_attr(in, obj, key.s(), line);
  }
  if (obj.is_none()) return Value::undefined("None has no element " + repr(key));
  return Value::undefined(object_repr(obj) + " has no element " + repr(key));
}

bool call_method(Interp& in, const Value& obj, const std::string& name, CallArgs& args, int line,
                 Value& result) {
  if (obj.is_undefined()) undefined_error(obj, line);
  if (obj.is_string()) return str_method(in, obj.s(), name, args, line, result);
  if (is_mutating(obj, name))
    throw TemplateError(
        "access to attribute '" + name + "' of '" + type_name(obj) + "' object is unsafe.", line);
  if (obj.type == T::dict && is_dict_method(name)) {
    if (name == "get") {
      const Value* k = arg(args, 0, "key");
      if (!k) throw TemplateError("get expected at least 1 argument, got 0", line);
      const Value* d = arg(args, 1, "default");
      const Value* v = obj.dict->find(*k);
      result = v ? *v : d ? *d : Value::none();
      return true;
    }
    List out;
    for (const auto& [k, v] : obj.dict->items) {
      if (name == "items")
        out.push_back(Value::make_list({k, v}, true));
      else
        out.push_back(name == "keys" ? k : v);
    }
    result = Value::make_list(std::move(out));
    return true;
  }
  if (obj.is_sequence() && is_list_method(name)) {
    const Value* x = arg(args, 0, "value");
    if (!x) throw TemplateError(name + "() takes exactly one argument (0 given)", line);
    int64_t n = 0, first = -1;
    for (size_t k = 0; k < obj.list->size(); ++k)
      if (equals((*obj.list)[k], *x)) {
        if (first < 0) first = static_cast<int64_t>(k);
        ++n;
      }
    if (name == "index" && first < 0) throw TemplateError(repr(*x) + " is not in list", line);
    result = Value::integer(name == "index" ? first : n);
    return true;
  }
  return false;
}

}  // namespace edgellm::jinja
