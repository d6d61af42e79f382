// Registers a candidate's C++ functions as PyTorch operators: no Python C API, no pybind11.
//
// A load_inline(functions=[...]) extension normally gets a pybind11 binding compiled into the same
// translation unit as the candidate's code, so the object file references the Python C API whatever
// the candidate wrote. Here the evaluator appends a table of the listed functions to the candidate's
// translation unit instead,
//     const kevin_ops::Export exports[] = {{"f", &kevin_ops::make<&f>}};
//     extern "C" const kevin_ops::Table kevin_ops_table = {"kevin_<key>", exports, 1};
// and links a registration object of its own (kevin_glue.o, built once by the evaluator from GLUE_SOURCE
// in builder.py), which reads the table when the library is loaded and defines the operators
// (torch::Library, kind DEF). The registration API is therefore called only from that object: the
// candidate's object needs no Python symbol, no torch::Library and no dispatcher, so any such reference
// is the candidate's own and is refused when the evaluator reads its symbol table (symbols.py).
//
// Adapter<&f>::call has the parameter types the operator schema supports (int64_t, double, bool,
// Tensor, lists, optionals, strings); it converts them to f's own parameter types (int, float,
// std::vector<int>, Tensor&, ...) so candidates write the signatures they would write for pybind11.
#pragma once
#include <torch/library.h>
#include <ATen/core/Tensor.h>
#include <c10/util/ArrayRef.h>
#include <cstddef>
#include <optional>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

namespace kevin_ops {

template <class T> using Plain = std::remove_cv_t<std::remove_reference_t<T>>;
template <class T> struct unsupported : std::false_type {};
template <class T> constexpr bool is_int_v = std::is_integral_v<T> && !std::is_same_v<T, bool>;

// Param<T>: the schema type a parameter of C++ type T travels as, and the conversion back to T.
template <class T, class = void> struct Param {
  static_assert(unsupported<T>::value,
                "this parameter type cannot be passed to a function listed in load_inline(functions=...): "
                "use torch::Tensor, integers, float/double, bool, std::vector of those, std::optional or std::string");
};
template <> struct Param<at::Tensor> {
  using type = const at::Tensor&;
  static at::Tensor get(const at::Tensor& v) { return v; }
};
template <class T> struct Param<T, std::enable_if_t<is_int_v<T>>> {
  using type = int64_t;
  static T get(int64_t v) { return static_cast<T>(v); }
};
template <class T> struct Param<T, std::enable_if_t<std::is_floating_point_v<T>>> {
  using type = double;
  static T get(double v) { return static_cast<T>(v); }
};
template <> struct Param<bool> {
  using type = bool;
  static bool get(bool v) { return v; }
};
template <class T> struct Param<std::vector<T>, std::enable_if_t<is_int_v<T>>> {
  using type = c10::ArrayRef<int64_t>;
  static std::vector<T> get(c10::ArrayRef<int64_t> v) { return std::vector<T>(v.begin(), v.end()); }
};
template <class T> struct Param<std::vector<T>, std::enable_if_t<std::is_floating_point_v<T>>> {
  using type = c10::ArrayRef<double>;
  static std::vector<T> get(c10::ArrayRef<double> v) { return std::vector<T>(v.begin(), v.end()); }
};
template <> struct Param<c10::ArrayRef<int64_t>> {
  using type = c10::ArrayRef<int64_t>;
  static c10::ArrayRef<int64_t> get(c10::ArrayRef<int64_t> v) { return v; }
};
template <> struct Param<std::vector<at::Tensor>> {
  using type = c10::ArrayRef<at::Tensor>;
  static std::vector<at::Tensor> get(c10::ArrayRef<at::Tensor> v) { return v.vec(); }
};
template <> struct Param<c10::ArrayRef<at::Tensor>> {
  using type = c10::ArrayRef<at::Tensor>;
  static c10::ArrayRef<at::Tensor> get(c10::ArrayRef<at::Tensor> v) { return v; }
};
template <> struct Param<std::string> {
  using type = c10::string_view;
  static std::string get(c10::string_view v) { return std::string(v.data(), v.size()); }
};
template <class T> struct Param<std::optional<T>> {
  using inner = Param<Plain<T>>;
  using type = std::optional<Plain<typename inner::type>>;
  static std::optional<T> get(const type& v) {
    if (v) return std::optional<T>(inner::get(*v));
    return std::nullopt;
  }
};

// Ret<R>: the schema type a return value of C++ type R travels back as.
template <class R, class = void> struct Ret {
  using type = R;
  static R put(R&& r) { return std::move(r); }
};
template <> struct Ret<void> { using type = void; };
template <class R> struct Ret<R, std::enable_if_t<is_int_v<R>>> {
  using type = int64_t;
  static int64_t put(R r) { return static_cast<int64_t>(r); }
};
template <class R> struct Ret<R, std::enable_if_t<std::is_floating_point_v<R>>> {
  using type = double;
  static double put(R r) { return static_cast<double>(r); }
};
template <class A, class B> struct Ret<std::pair<A, B>> {
  using type = std::tuple<A, B>;
  static type put(std::pair<A, B>&& r) { return type(std::move(r.first), std::move(r.second)); }
};

// Adapter<&f>::call: converted values are held as lvalues, so f may take T, const T& or T&. Specialised on
// the function's type, so noexcept functions match exactly one form.
template <auto F, class Fn> struct AdapterOf;
template <auto F, class R, class... A> struct AdapterOf<F, R (*)(A...)> {
  static typename Ret<Plain<R>>::type call(typename Param<Plain<A>>::type... args) {
    std::tuple<Plain<A>...> values(Param<Plain<A>>::get(args)...);
    if constexpr (std::is_void_v<R>) {
      std::apply([](Plain<A>&... v) { F(v...); }, values);
    } else {
      return Ret<Plain<R>>::put(std::apply([](Plain<A>&... v) -> Plain<R> { return F(v...); }, values));
    }
  }
};
template <auto F, class R, class... A> struct AdapterOf<F, R (*)(A...) noexcept> : AdapterOf<F, R (*)(A...)> {};
template <auto F> struct Adapter : AdapterOf<F, decltype(F)> {};

// The table the registration object reads (see the top of this file). Plain constants only (a string, a
// function pointer per function), so it is filled in before any code of the library runs.
struct Export {
  const char* name;
  torch::CppFunction (*make)();
};
struct Table {
  const char* ns;
  const Export* entries;
  std::size_t count;
};
// The operator's kernel with its schema inferred from Adapter<F>::call's type (what m.def(name, &fn) does).
template <auto F> torch::CppFunction make() { return torch::CppFunction(&Adapter<F>::call); }

}  // namespace kevin_ops

// Hidden: the registration object of this library reads this library's table, never another's.
extern "C" __attribute__((visibility("hidden"))) const kevin_ops::Table kevin_ops_table;
