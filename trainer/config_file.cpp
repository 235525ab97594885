// toml++ 3.x, header-only (its default), compiled in this file only.
#include "trainer/config_file.h"

#include <fmt/format.h>

#include <algorithm>
#include <sstream>
#include <string_view>

#if __has_include(<toml++/toml.hpp>)
#include <toml++/toml.hpp>
#else
#include <toml++/toml.h>  // toml++ before 3.4 (Debian 12's libtomlplusplus-dev 3.3)
#endif

#include "kernels/common/check.h"

namespace fp4moe {

namespace {

const char* type_text(toml::node_type t) {
  switch (t) {
    case toml::node_type::table: return "a table";
    case toml::node_type::array: return "an array";
    case toml::node_type::string: return "a string";
    case toml::node_type::integer: return "an integer";
    case toml::node_type::floating_point: return "a float";
    case toml::node_type::boolean: return "a boolean";
    case toml::node_type::date:
    case toml::node_type::time:
    case toml::node_type::date_time: return "a date or time";
    case toml::node_type::none: break;
  }
  return "nothing";
}

// The value as TOML writes it, on one line (arrays and tables included).
std::string value_text(const toml::node& v) {
  std::ostringstream os;
  v.visit([&](const auto& n) { os << toml::toml_formatter(n, toml::format_flags::none); });
  std::string s = os.str();
  std::replace(s.begin(), s.end(), '\n', ' ');
  return s;
}

class FileReader {
 public:
  FileReader(const std::string& path, const std::vector<ConfigField>& fields, const std::set<std::string>& keep)
      : path_(path), fields_(fields), keep_(keep) {}

  std::set<std::string> read() {
    toml::table root;
    try {
      root = toml::parse_file(path_);
    } catch (const toml::parse_error& e) {
      std::string what(e.description());
      // A basic string left open runs into the end of its line, which toml++ reports as a control character.
      if (what.find("parsing string") != std::string::npos && what.find("control characters") != std::string::npos)
        what += " (a string not closed on its line?)";
      reject(e.source(), what);
    }
    walk(root, "");
    return set_;
  }

 private:
  [[noreturn]] void reject(const toml::source_region& where, const std::string& what) const {
    std::string msg = what;
    std::replace(msg.begin(), msg.end(), '\n', ' ');
    if (where.begin.line == 0) ::fp4moe::fail(__FILE__, __LINE__, fmt::format("config file '{}': {}", path_, msg));
    ::fp4moe::fail(__FILE__, __LINE__,
                   fmt::format("config file '{}', line {}, column {}: {}", path_, where.begin.line,
                               where.begin.column, msg));
  }

  const ConfigField* field(const std::string& key) const {
    for (const ConfigField& f : fields_)
      if (f.key == key) return &f;
    return nullptr;
  }
  bool is_prefix(const std::string& name) const {
    for (const ConfigField& f : fields_)
      if (f.key.starts_with(name + ".")) return true;
    return false;
  }

  void walk(const toml::table& table, const std::string& prefix) {
    for (auto&& [k, v] : table) {
      const std::string name = prefix.empty() ? std::string(k.str()) : prefix + "." + std::string(k.str());
      const ConfigField* f = field(name);
      const toml::table* sub = v.as_table();
      if (f == nullptr && sub != nullptr && (!sub->empty() || is_prefix(name))) {
        walk(*sub, name);
        continue;
      }
      if (f == nullptr)
        reject(k.source(), fmt::format("unknown option '{}' (a key of a [section]; fp4moe train --help lists them)",
                                     name));
      assign(*f, v, k.source());
    }
  }

  void assign(const ConfigField& f, const toml::node& v, const toml::source_region& where) {
    const bool apply = !keep_.count(f.key);
    auto wrong = [&](const char* expected) {
      reject(where, fmt::format("{} = {}: expected {}, got {}", f.key, value_text(v), expected, type_text(v.type())));
    };
    std::visit(
        [&](auto* var) {
          using T = std::remove_pointer_t<decltype(var)>;
          if constexpr (std::is_same_v<T, int64_t>) {
            if (!v.is_integer()) wrong("an integer");
            if (apply) *var = v.as_integer()->get();
          } else if constexpr (std::is_same_v<T, double>) {
            if (!v.is_floating_point() && !v.is_integer()) wrong("a number");
            if (apply)
              *var = v.is_integer() ? static_cast<double>(v.as_integer()->get()) : v.as_floating_point()->get();
          } else if constexpr (std::is_same_v<T, std::string>) {
            if (!v.is_string()) wrong("a string");
            if (apply) *var = v.as_string()->get();
          } else if constexpr (std::is_same_v<T, bool>) {
            if (!v.is_boolean()) wrong("a boolean (true or false)");
            if (apply) *var = v.as_boolean()->get();
          } else {
            const toml::array* a = v.as_array();
            if (a == nullptr || (!a->empty() && !a->is_homogeneous(toml::node_type::string)))
              wrong("an array of strings");
            std::vector<std::string> items;
            for (const toml::node& item : *a) items.push_back(item.as_string()->get());
            if (apply) *var = std::move(items);
          }
        },
        f.target);
    set_.insert(f.key);
  }

  const std::string& path_;
  const std::vector<ConfigField>& fields_;
  const std::set<std::string>& keep_;
  std::set<std::string> set_;
};

}  // namespace

std::set<std::string> read_config_file(const std::string& path, const std::vector<ConfigField>& fields,
                                       const std::set<std::string>& keep) {
  return FileReader(path, fields, keep).read();
}

std::string toml_basic_string(const std::string& s) {
  std::string q = "\"";
  for (const char c : s) {
    switch (c) {
      case '"': q += "\\\""; break;
      case '\\': q += "\\\\"; break;
      case '\b': q += "\\b"; break;
      case '\t': q += "\\t"; break;
      case '\n': q += "\\n"; break;
      case '\f': q += "\\f"; break;
      case '\r': q += "\\r"; break;
      default: {
        const auto u = static_cast<unsigned char>(c);
        q += u < 0x20 || u == 0x7f ? fmt::format("\\u{:04X}", u) : std::string(1, c);
      }
    }
  }
  return q + "\"";
}

}  // namespace fp4moe
