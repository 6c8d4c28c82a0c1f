// The filters, tests and global functions of transformers' jinja2
// environment, and the methods of Python str, dict and list that templates call.
#pragma once

#include <string_view>

#include "jinja/ast.h"
#include "jinja/value.h"

namespace edgellm::jinja {

// nullptr when jinja2 has no such filter / test, or we do not support it.
FilterFn find_filter(std::string_view name);
TestFn find_test(std::string_view name);
// Whether jinja2 knows the filter (so the error can say "not supported" rather than "no filter").
bool jinja2_has_filter(std::string_view name);

// range, namespace, dict, raise_exception, strftime_now, cycler, joiner; undefined if none.
Value global(std::string_view name);
// obj.name for a Python object (str, dict, list methods; dict keys, namespace attrs,
// loop attributes); undefined when there is none.
Value get_attr(Interp& in, const Value& obj, const std::string& name, int line);
// obj[key]: subscript first, then attribute for a string key (jinja2's getitem).
Value get_item(Interp& in, const Value& obj, const Value& key, int line);
// obj.name(args) without building the bound method first.
bool call_method(Interp& in, const Value& obj, const std::string& name, CallArgs& args, int line,
                 Value& result);

// Python's `format % args` (printf-style: %s %r %d %i %x %X %o %f %%, flags - and 0,
// width, precision, %(key)s); anything else is refused by name.
Value percent_format(const Value& format, const Value& args, int line);

}  // namespace edgellm::jinja
