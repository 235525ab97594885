// How the parameters of the parameterised GPU tests print in GoogleTest's output (the `GetParam() = ...` of
// --gtest_list_tests and of a failure): recipes, scale modes and row formats by name instead of GoogleTest's byte dump of an
// enum class. GoogleTest finds a PrintTo in the parameter's namespace (tests/python/test_test_names.py checks
// that no parameter prints as bytes).
#pragma once

#include <ostream>

#include "kernels/gemm/cublaslt_matmul.h"
#include "trainer/comm/ep_payload.h"
#include "trainer/model/recipe.h"

namespace fp4moe {

inline void PrintTo(LtScaleMode m, std::ostream* os) { *os << lt_scale_mode_name(m); }
inline void PrintTo(const Recipe& r, std::ostream* os) { *os << recipe_name(r); }
inline void PrintTo(EpRowFormat f, std::ostream* os) { *os << ep_row_format_name(f); }

}  // namespace fp4moe
