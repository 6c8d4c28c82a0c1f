// The Jinja interpreter for the differential tests (tests/test_jinja_*.py).
#pragma once

#include <nanobind/nanobind.h>

void bind_jinja(nanobind::module_& m);
