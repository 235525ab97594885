// Reading a trainer configuration file (trainer/config.h): TOML v1.0 parsed by toml++, each `section.key` assigned
// to the variable of the option of that name. Only trainer/config_file.cpp includes toml++.
#pragma once

#include <cstdint>
#include <set>
#include <string>
#include <variant>
#include <vector>

namespace fp4moe {

// One option of the configuration: its name `section.key` and the variable a file value goes to. The variable's
// type is the value type the file must give: int64_t an integer, double a float or an integer, std::string a
// string, bool a boolean (true or false), std::vector<std::string> an array of strings.
struct ConfigField {
  std::string key;
  std::variant<int64_t*, double*, std::string*, bool*, std::vector<std::string>*> target;
};

// Parses the TOML file at `path` and assigns each of its keys to the field of that name, except the keys in
// `keep` (given on the command line, which wins over the file); those are still checked. A key is the dotted path
// of a value: `[train]` then `lr = 1e-3`, or `train.lr = 1e-3` at the top. Returns the keys the file sets.
// Throws fp4moe::Error, one line starting "config file 'PATH'", with the line and column toml++ reports, for: a
// file that cannot be read; a TOML syntax error (among them a key or table given twice, an unterminated string,
// a bad escape); a key no field has (also a value outside a section, a table nested in a section); a value of
// another type than the field's (a string for an integer, a float for an integer, an array with a non-string).
std::set<std::string> read_config_file(const std::string& path, const std::vector<ConfigField>& fields,
                                       const std::set<std::string>& keep);

// `s` as a TOML basic string, quotes included: `"` and `\` escaped with a backslash, the control characters
// U+0000 to U+001F and U+007F as \b \t \n \f \r or \uXXXX; every other byte as it is (UTF-8 text stays valid).
// Takes any string.
std::string toml_basic_string(const std::string& s);

}  // namespace fp4moe
