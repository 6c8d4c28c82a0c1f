#include "jinja/value.h"

#include <charconv>
#include <cmath>
#include <cstdio>

#include "edgellm/jinja.h"
#include "jinja/budget.h"
#include "jinja/pystr.h"

namespace edgellm::jinja {

const std::string& Value::empty_text() {
  static const std::string empty;
  return empty;
}

void Value::set_text(std::string text) {
  text_ = text.empty() ? nullptr : hold_text(std::move(text));
}

namespace {

uint16_t depth_over(const List& items) {
  size_t depth = 0;
  for (const Value& x : items) depth = std::max<size_t>(depth, x.depth);
  check_depth(depth + 1);
  return static_cast<uint16_t>(std::min<size_t>(depth + 1, UINT16_MAX));
}

}  // namespace

Value Value::make_list(List items, bool tuple) {
  Value v = with_type(tuple ? Type::tuple : Type::list);
  v.depth = depth_over(items);
  v.list = hold_list(std::move(items));
  return v;
}

Value Value::make_dict(Dict d) {
  Value v = with_type(Type::dict);
  size_t depth = 0;
  for (const auto& [k, x] : d.items) depth = std::max<size_t>(depth, std::max(k.depth, x.depth));
  check_depth(depth + 1);
  v.depth = static_cast<uint16_t>(std::min<size_t>(depth + 1, UINT16_MAX));
  v.dict = hold_dict(std::move(d));
  return v;
}

const Value* Dict::find(const Value& key) const {
  charge_work(items.size() * kLookupBytes);  // a linear search
  for (const auto& [k, v] : items)
    if (equals(k, key)) return &v;
  return nullptr;
}

const Value* Dict::find(std::string_view key) const {
  charge_work(items.size() * kLookupBytes);
  for (const auto& [k, v] : items)
    if (k.type == Value::Type::string && k.s() == key) return &v;
  return nullptr;
}

void Dict::set(Value key, Value value) {
  charge_work(items.size() * kLookupBytes);
  for (auto& [k, v] : items)
    if (equals(k, key)) {
      v = std::move(value);
      return;
    }
  items.emplace_back(std::move(key), std::move(value));
}

std::string type_name(const Value& v) {
  using T = Value::Type;
  switch (v.type) {
    case T::undefined:
      return "Undefined";
    case T::none:
      return "NoneType";
    case T::boolean:
      return "bool";
    case T::integer:
      return "int";
    case T::floating:
      return "float";
    case T::string:
      return "str";
    case T::list:
      return v.generator ? "generator" : "list";
    case T::tuple:
      return "tuple";
    case T::dict:
      return "dict";
    case T::ns:
      return "Namespace";
    case T::callable:
      return "function";
    case T::loop:
      return "LoopContext";
  }
  return "object";
}

bool truthy(const Value& v) {
  using T = Value::Type;
  switch (v.type) {
    case T::undefined:
    case T::none:
      return false;
    case T::boolean:
      return v.b;
    case T::integer:
      return v.i != 0;
    case T::floating:
      return v.f != 0.0;
    case T::string:
      return !v.s().empty();
    case T::list:
    case T::tuple:
      return v.generator || !v.list->empty();
    case T::dict:
      return !v.dict->items.empty();
    default:
      return true;
  }
}

// Python's repr(float): the shortest digits that round-trip, in fixed
// notation when the decimal point sits within [-4, 16), else d.ddde+XX.
std::string float_repr(double x) {
  if (std::isnan(x)) return "nan";
  if (std::isinf(x)) return x > 0 ? "inf" : "-inf";
  char buf[64];
  auto res = std::to_chars(buf, buf + sizeof(buf), x, std::chars_format::scientific);
  std::string sci(buf, res.ptr);
  std::string sign;
  if (sci[0] == '-') {
    sign = "-";
    sci.erase(0, 1);
  }
  const size_t e = sci.find('e');
  std::string digits = sci.substr(0, e);
  const int exp10 = std::stoi(sci.substr(e + 1));
  digits.erase(std::remove(digits.begin(), digits.end(), '.'), digits.end());
  const int nd = static_cast<int>(digits.size());
  const int decpt = exp10 + 1;
  std::string out = sign;
  if (decpt > -4 && decpt <= 16) {
    if (decpt <= 0) {
      out += "0." + std::string(static_cast<size_t>(-decpt), '0') + digits;
    } else if (decpt >= nd) {
      out += digits + std::string(static_cast<size_t>(decpt - nd), '0') + ".0";
    } else {
      out += digits.substr(0, static_cast<size_t>(decpt)) + "." +
             digits.substr(static_cast<size_t>(decpt));
    }
    return out;
  }
  out += digits.substr(0, 1);
  if (nd > 1) out += "." + digits.substr(1);
  char ebuf[16];
  std::snprintf(ebuf, sizeof(ebuf), "e%c%02d", exp10 < 0 ? '-' : '+', std::abs(exp10));
  return out + ebuf;
}

std::string repr_string(std::string_view s) {
  const bool has_single = s.find('\'') != std::string_view::npos;
  const bool has_double = s.find('"') != std::string_view::npos;
  const char quote = has_single && !has_double ? '"' : '\'';
  std::string out(1, quote);
  size_t n = 0;
  for (char32_t c : pystr::decode(s)) {
    if (++n % 4096 == 0) check_string_size(out.size());  // an escape is at most 10 bytes
    if (c == static_cast<char32_t>(quote) || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c == '\t') {
      out += "\\t";
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c < 0x20 || c == 0x7f) {
      char b[8];
      std::snprintf(b, sizeof(b), "\\x%02x", static_cast<unsigned>(c));
      out += b;
    } else if (c < 0x7f || pystr::is_printable(c)) {
      pystr::append_utf8(out, c);
    } else {
      char b[16];
      if (c < 0x100)
        std::snprintf(b, sizeof(b), "\\x%02x", static_cast<unsigned>(c));
      else if (c < 0x10000)
        std::snprintf(b, sizeof(b), "\\u%04x", static_cast<unsigned>(c));
      else
        std::snprintf(b, sizeof(b), "\\U%08x", static_cast<unsigned>(c));
      out += b;
    }
  }
  out += quote;
  check_string_size(out.size());
  return out;
}

std::string html_escape(std::string_view s) {
  check_string_size(mul_sat(s.size(), 5));  // worst case: every byte an entity
  charge_work(mul_sat(s.size(), 6));
  std::string out;
  out.reserve(s.size());
  for (char c : s) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '\'':
        out += "&#39;";
        break;
      case '"':
        out += "&#34;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

std::string repr(const Value& v) {
  using T = Value::Type;
  switch (v.type) {
    case T::undefined:
      return "Undefined";
    case T::string:
      return repr_string(v.s());
    default:
      return to_str(v);
  }
}

std::string to_str(const Value& v) {
  using T = Value::Type;
  switch (v.type) {
    case T::undefined:
      return "";
    case T::none:
      return "None";
    case T::boolean:
      return v.b ? "True" : "False";
    case T::integer:
      return std::to_string(v.i);
    case T::floating:
      return float_repr(v.f);
    case T::string:
      charge_work(v.s().size());  // a copy
      return v.s();
    case T::list:
    case T::tuple: {
      if (v.generator) return "<generator object>";
      const WalkLevel level;
      const bool tuple = v.type == T::tuple;
      TextBuffer out;
      out.append(tuple ? "(" : "[");
      for (size_t k = 0; k < v.list->size(); ++k) {
        if (k) out.append(", ");
        out.append(repr((*v.list)[k]));
      }
      if (tuple && v.list->size() == 1) out.append(",");
      out.append(tuple ? ")" : "]");
      return out.take();
    }
    case T::dict:
    case T::ns: {
      const WalkLevel level;
      const Dict& d = v.type == T::dict ? *v.dict : v.ns->attrs;
      TextBuffer out;
      out.append(v.type == T::ns ? "<Namespace {" : "{");
      for (size_t k = 0; k < d.items.size(); ++k) {
        if (k) out.append(", ");
        out.append(repr(d.items[k].first));
        out.append(": ");
        out.append(repr(d.items[k].second));
      }
      out.append(v.type == T::ns ? "}>" : "}");
      return out.take();
    }
    case T::callable:
      return "<function " + v.fn->name + ">";
    case T::loop:
      return "<LoopContext>";
  }
  return "";
}

bool equals(const Value& a, const Value& b) {
  using T = Value::Type;
  charge_work(kLookupBytes);
  if (a.is_number() && b.is_number()) {
    if (a.is_int() && b.is_int()) return a.as_int() == b.as_int();
    return a.as_double() == b.as_double();
  }
  if (a.type != b.type) return false;
  switch (a.type) {
    case T::undefined:
    case T::none:
      return true;
    case T::string:
      if (a.s().size() == b.s().size()) charge_work(a.s().size());
      return a.s() == b.s();
    case T::list:
    case T::tuple: {
      if (a.list == b.list) return true;
      const WalkLevel level;
      if (a.generator || b.generator) return false;
      if (a.list->size() != b.list->size()) return false;
      for (size_t k = 0; k < a.list->size(); ++k)
        if (!equals((*a.list)[k], (*b.list)[k])) return false;
      return true;
    }
    case T::dict: {
      if (a.dict == b.dict) return true;
      const WalkLevel level;
      if (a.dict->items.size() != b.dict->items.size()) return false;
      for (const auto& [k, v] : a.dict->items) {
        const Value* o = b.dict->find(k);
        if (!o || !equals(v, *o)) return false;
      }
      return true;
    }
    case T::ns:
      return a.ns == b.ns;
    case T::callable:
      return a.fn == b.fn;
    case T::loop:
      return a.loop == b.loop;
    default:
      return false;
  }
}

int compare(const Value& a, const Value& b, int line) {
  if (a.is_number() && b.is_number()) {
    if (a.is_int() && b.is_int()) return a.as_int() < b.as_int() ? -1 : a.as_int() > b.as_int();
    const double x = a.as_double(), y = b.as_double();
    return x < y ? -1 : x > y ? 1 : 0;
  }
  if (a.is_undefined() || b.is_undefined())
    throw TemplateError("'" + (a.is_undefined() ? a.s() : b.s()) + "' is undefined", line);
  if (a.is_string() && b.is_string()) {
    charge_work(std::min(a.s().size(), b.s().size()));
    const int c = a.s().compare(b.s());
    return c < 0 ? -1 : c > 0 ? 1 : 0;
  }
  if (a.is_sequence() && a.type == b.type) {
    charge_work(kLookupBytes);
    const WalkLevel level;
    const size_t n = std::min(a.list->size(), b.list->size());
    for (size_t k = 0; k < n; ++k) {
      if (equals((*a.list)[k], (*b.list)[k])) continue;
      return compare((*a.list)[k], (*b.list)[k], line);
    }
    return a.list->size() < b.list->size() ? -1 : a.list->size() > b.list->size();
  }
  throw TemplateError(
      "'<' not supported between instances of '" + type_name(a) + "' and '" + type_name(b) + "'",
      line);
}

Value from_json(const nlohmann::ordered_json& j) {
  using J = nlohmann::ordered_json::value_t;
  switch (j.type()) {
    case J::null:
      return Value::none();
    case J::boolean:
      return Value::boolean(j.get<bool>());
    case J::number_integer:
      return Value::integer(j.get<int64_t>());
    case J::number_unsigned: {
      const auto u = j.get<uint64_t>();
      if (u <= static_cast<uint64_t>(INT64_MAX)) return Value::integer(static_cast<int64_t>(u));
      return Value::floating(static_cast<double>(u));
    }
    case J::number_float:
      return Value::floating(j.get<double>());
    case J::string:
      return Value::string(j.get<std::string>());
    case J::array: {
      List items;
      items.reserve(j.size());
      for (const auto& e : j) items.push_back(from_json(e));
      return Value::make_list(std::move(items));
    }
    case J::object: {
      Dict d;
      d.items.reserve(j.size());
      for (const auto& [k, e] : j.items()) d.items.emplace_back(Value::string(k), from_json(e));
      return Value::make_dict(std::move(d));
    }
    default:
      return Value::none();
  }
}

namespace {

void dump_string(std::string_view s, bool ensure_ascii, std::string& out) {
  charge_work(mul_sat(s.size(), 2));
  out += '"';
  size_t n = 0;
  // An escape is at most 12 bytes: the size is checked every 4096 characters.
  auto check = [&] {
    if (++n % 4096 == 0) check_string_size(out.size());
  };
  auto hex4 = [&](unsigned c) {
    char b[8];
    std::snprintf(b, sizeof(b), "\\u%04x", c);
    out += b;
  };
  auto plain = [&](char32_t c) {
    switch (c) {
      case '"':
        out += "\\\"";
        return true;
      case '\\':
        out += "\\\\";
        return true;
      case '\n':
        out += "\\n";
        return true;
      case '\r':
        out += "\\r";
        return true;
      case '\t':
        out += "\\t";
        return true;
      case '\b':
        out += "\\b";
        return true;
      case '\f':
        out += "\\f";
        return true;
      default:
        if (c < 0x20) {
          hex4(static_cast<unsigned>(c));
          return true;
        }
        return false;
    }
  };
  if (!ensure_ascii && pystr::is_ascii(s)) {
    for (char ch : s) {
      check();
      if (!plain(static_cast<unsigned char>(ch))) out += ch;
    }
  } else {
    for (char32_t c : pystr::decode(s)) {
      check();
      if (plain(c)) continue;
      if (!ensure_ascii || c < 0x7f + 1) {
        pystr::append_utf8(out, c);
      } else if (c < 0x10000) {
        hex4(static_cast<unsigned>(c));
      } else {
        const char32_t v = c - 0x10000;
        hex4(0xd800 | static_cast<unsigned>(v >> 10));
        hex4(0xdc00 | static_cast<unsigned>(v & 0x3ff));
      }
    }
  }
  out += '"';
}

std::string json_float(double x) {
  if (std::isnan(x)) return "NaN";
  if (std::isinf(x)) return x > 0 ? "Infinity" : "-Infinity";
  return float_repr(x);
}

[[noreturn]] void not_serializable(const Value& v, int line) {
  throw TemplateError("Object of type " + type_name(v) + " is not JSON serializable", line);
}

}  // namespace

void dump_json(const Value& v, const JsonDumpOptions& o, int level, std::string& out, int line) {
  using T = Value::Type;
  if (level > 500) throw TemplateError("tojson: value nested too deeply", line);
  charge_work(kLookupBytes);
  auto newline = [&](int lvl) {
    check_string_size(add_sat(out.size(), mul_sat(static_cast<size_t>(lvl), o.indent.size()) + 1));
    out += '\n';
    for (int k = 0; k < lvl; ++k) out += o.indent;
  };
  switch (v.type) {
    case T::none:
      out += "null";
      return;
    case T::boolean:
      out += v.b ? "true" : "false";
      return;
    case T::integer:
      out += std::to_string(v.i);
      return;
    case T::floating:
      out += json_float(v.f);
      return;
    case T::string:
      dump_string(v.s(), o.ensure_ascii, out);
      check_string_size(out.size());
      return;
    case T::list:
    case T::tuple: {
      if (v.generator) not_serializable(v, line);
      if (v.list->empty()) {
        out += "[]";
        return;
      }
      out += '[';
      if (o.has_indent) newline(level + 1);
      for (size_t k = 0; k < v.list->size(); ++k) {
        if (k) {
          append_checked(out, o.item_sep);
          if (o.has_indent) newline(level + 1);
        }
        dump_json((*v.list)[k], o, level + 1, out, line);
      }
      if (o.has_indent) newline(level);
      out += ']';
      return;
    }
    case T::dict: {
      if (v.dict->items.empty()) {
        out += "{}";
        return;
      }
      std::vector<const std::pair<Value, Value>*> items;
      for (const auto& kv : v.dict->items) items.push_back(&kv);
      if (o.sort_keys)
        std::stable_sort(items.begin(), items.end(),
                         [&](auto* a, auto* b) { return compare(a->first, b->first, line) < 0; });
      out += '{';
      if (o.has_indent) newline(level + 1);
      bool first = true;
      for (const auto* kv : items) {
        if (!first) {
          append_checked(out, o.item_sep);
          if (o.has_indent) newline(level + 1);
        }
        first = false;
        const Value& k = kv->first;
        switch (k.type) {
          case T::string:
            dump_string(k.s(), o.ensure_ascii, out);
            break;
          case T::none:
            out += "\"null\"";
            break;
          case T::boolean:
            out += k.b ? "\"true\"" : "\"false\"";
            break;
          case T::integer:
            out += "\"" + std::to_string(k.i) + "\"";
            break;
          case T::floating:
            out += "\"" + json_float(k.f) + "\"";
            break;
          default:
            throw TemplateError("keys must be str, int, float, bool or None, not " + type_name(k),
                                line);
        }
        append_checked(out, o.key_sep);
        dump_json(kv->second, o, level + 1, out, line);
      }
      if (o.has_indent) newline(level);
      out += '}';
      return;
    }
    default:
      not_serializable(v, line);
  }
}

}  // namespace edgellm::jinja
