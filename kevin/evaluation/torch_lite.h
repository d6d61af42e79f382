// Narrow stand-in for <torch/extension.h> / <torch/types.h> in CUDA translation units (the fast
// compile path of kevin.evaluation.compiler). Parsing the full torch headers is most of a CUDA
// extension's build time; kernels and their host wrappers need only the Tensor class, the
// allocation ops, the dispatch macros and TORCH_CHECK. The `torch` namespace aliases below are the
// ones torch/types.h defines. A source that needs more fails to compile here and is rebuilt with the
// full header, so nothing a candidate can write is judged differently.
#pragma once
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <ATen/ops/empty_strided.h>
#include <ATen/ops/zeros.h>
#include <ATen/ops/zeros_like.h>
#include <ATen/ops/ones.h>
#include <ATen/ops/ones_like.h>
#include <ATen/ops/full.h>
#include <ATen/ops/full_like.h>
#include <ATen/Dispatch.h>
#include <c10/util/Exception.h>
#include <optional>
namespace torch {
using namespace at;  // NOLINT
using Dtype = at::ScalarType;
constexpr auto kUInt8 = at::kByte;
constexpr auto kInt8 = at::kChar;
constexpr auto kInt16 = at::kShort;
constexpr auto kInt32 = at::kInt;
constexpr auto kInt64 = at::kLong;
constexpr auto kFloat16 = at::kHalf;
constexpr auto kFloat32 = at::kFloat;
constexpr auto kFloat64 = at::kDouble;
constexpr auto kU8 = kUInt8;
constexpr auto kI8 = kInt8;
constexpr auto kI16 = kInt16;
constexpr auto kI32 = kInt32;
constexpr auto kI64 = kInt64;
constexpr auto kF16 = kFloat16;
constexpr auto kF32 = kFloat32;
constexpr auto kF64 = kFloat64;
}  // namespace torch
