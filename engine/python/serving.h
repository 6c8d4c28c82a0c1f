// The serving part of the binding (see serving.cpp).
#pragma once

#include <nanobind/nanobind.h>

void bind_serving(nanobind::module_& m);
