// Unit tests of the Jinja subset: syntax, whitespace control (trim_blocks/lstrip_blocks as transformers sets
// them), filters, tests, methods, namespaces, macros, slicing and error positions.
#include <gtest/gtest.h>

#include "core/error.h"
#include "tokenizer/jinja.h"

namespace lmtune::jinja {
namespace {

std::string render(const std::string& source, const nlohmann::json& vars = nlohmann::json::object()) {
  return Template(source).render(vars);
}

TEST(Jinja, ExpressionsAndOperators) {
  EXPECT_EQ(render("{{ 1 + 2 * 3 }}|{{ 7 // 2 }}|{{ -7 % 3 }}|{{ 7 / 2 }}|{{ 2 ** 10 }}"), "7|3|2|3.5|1024");
  EXPECT_EQ(render("{{ 'a' ~ 1 ~ none }}|{{ 'ab' + 'cd' }}|{{ 'x' * 3 }}"), "a1None|abcd|xxx");
  EXPECT_EQ(render("{{ true and not false }}|{{ 0 or 'y' }}|{{ 'b' in 'abc' }}|{{ 3 not in [1, 2] }}"), "True|y|True|True");
  EXPECT_EQ(render("{{ 'yes' if x else 'no' }}{{ 'z' if false }}", {{"x", 1}}), "yes");
  EXPECT_EQ(render("{{ [1, 2] + [3] }}|{{ {'a': 1}['a'] }}|{{ (1, 2)[1] }}"), "[1, 2, 3]|1|2");
}

TEST(Jinja, WhitespaceControl) {
  EXPECT_EQ(render("a  {{- 'b' -}}  c"), "abc");
  // trim_blocks removes the newline after a block tag; lstrip_blocks the indentation before it.
  EXPECT_EQ(render("{% if true %}\n    x\n    {% endif %}\ny"), "    x\ny");
  EXPECT_EQ(render("  {%- if true %}a{% endif -%}  \n b"), "ab");
  EXPECT_EQ(render("{{ 'a' }}\n{{ 'b' }}\n"), "a\nb");  // no trim after {{ }}; one trailing newline dropped
  EXPECT_EQ(render("{# comment #}\nx"), "x");
  EXPECT_EQ(render("{% raw %}{{ not evaluated }}{% endraw %}"), "{{ not evaluated }}");
}

TEST(Jinja, LoopsAndScopes) {
  EXPECT_EQ(render("{% for x in xs %}{{ loop.index0 }}{{ x }}{% if not loop.last %},{% endif %}{% endfor %}",
                   {{"xs", {"a", "b", "c"}}}),
            "0a,1b,2c");
  EXPECT_EQ(render("{% for x in xs %}{{ loop.index }}/{{ loop.length }}{{ loop.first }} {% endfor %}", {{"xs", {1, 2}}}),
            "1/2True 2/2False ");
  EXPECT_EQ(render("{% for x in xs if x > 1 %}{{ x }}{% else %}none{% endfor %}", {{"xs", {1, 2, 3}}}), "23");
  EXPECT_EQ(render("{% for x in [] %}{{ x }}{% else %}empty{% endfor %}"), "empty");
  EXPECT_EQ(render("{% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %}", {{"d", {{"a", 1}, {"b", 2}}}}), "a=1;b=2;");
  EXPECT_EQ(render("{% for x in [1,2,3,4] %}{% if x == 2 %}{% continue %}{% endif %}{% if x == 4 %}{% break %}{% endif %}{{ x }}{% endfor %}"), "13");
  // set inside a loop does not leak; namespace attributes do.
  EXPECT_EQ(render("{% set a = 1 %}{% set ns = namespace(b=1) %}{% for x in [5] %}{% set a = x %}{% set ns.b = x %}{% endfor %}{{ a }}{{ ns.b }}"), "15");
  EXPECT_EQ(render("{% set xs = [] %}{% set _ = xs.append(3) %}{{ xs }}"), "[3]");
}

TEST(Jinja, SlicingAndIndexing) {
  nlohmann::json vars = {{"m", {1, 2, 3, 4}}, {"s", "héllo"}};
  EXPECT_EQ(render("{{ m[1:] }}|{{ m[::-1] }}|{{ m[-1] }}|{{ m[:2] }}|{{ m[1:3] }}|{{ m[::2] }}", vars),
            "[2, 3, 4]|[4, 3, 2, 1]|4|[1, 2]|[2, 3]|[1, 3]");
  EXPECT_EQ(render("{{ s[1] }}|{{ s[::-1] }}|{{ s[1:3] }}", vars), "é|olléh|él");
}

TEST(Jinja, FiltersTestsAndMethods) {
  EXPECT_EQ(render("{{ '  a b  ' | trim }}|{{ 'ab' | upper }}|{{ 'hello world' | capitalize }}|{{ 'hello world' | title }}"),
            "a b|AB|Hello world|Hello World");
  EXPECT_EQ(render("{{ xs | length }}|{{ xs | join(', ') }}|{{ xs | first }}|{{ xs | last }}|{{ 'abc' | length }}",
                   {{"xs", {"a", "b"}}}),
            "2|a, b|a|b|3");
  EXPECT_EQ(render("{{ y | default('d') }}|{{ '' | default('e', true) }}|{{ 3 | string }}|{{ 'a-b' | replace('-', '+') }}"),
            "d|e|3|a+b");
  EXPECT_EQ(render("{{ {'a': [1, 'x\"y'], 'b': none, 'c': 1.5} | tojson }}"), R"({"a": [1, "x\"y"], "b": null, "c": 1.5})");
  EXPECT_EQ(render("{{ {'a': [1]} | tojson(indent=2) }}"), "{\n  \"a\": [\n    1\n  ]\n}");
  EXPECT_EQ(render("{{ 'é' | tojson }}"), "\"é\"");
  EXPECT_EQ(render("{{ x is defined }}{{ y is defined }}{{ none is none }}{{ 'a' is string }}{{ {} is mapping }}{{ [] is iterable }}{{ 3 is not string }}",
                   {{"x", 1}}),
            "TrueFalseTrueTrueTrueTrueTrue");
  EXPECT_EQ(render("{{ 4 is divisibleby(2) }}{{ 3 is odd }}{{ x is sameas false }}", {{"x", false}}), "TrueTrueTrue");
  EXPECT_EQ(render("{{ ' x\\n'.strip() }}|{{ 'xxaxx'.lstrip('x') }}|{{ 'a,b,,c'.split(',') }}|{{ ' a  b '.split() }}"),
            "x|axx|['a', 'b', '', 'c']|['a', 'b']");
  EXPECT_EQ(render("{{ 'abc'.startswith('ab') }}{{ 'abc'.endswith(('x', 'c')) }}{{ 'a</think>b'.split('</think>')[-1] }}"),
            "TrueTrueb");
  EXPECT_EQ(render("{{ d.get('a') }}{{ d.get('z', 0) }}{{ d.keys() | list }}{{ d | items | list }}", {{"d", {{"a", 1}}}}),
            "10['a'][['a', 1]]");
  EXPECT_EQ(render("{{ xs | selectattr('role', 'equalto', 'user') | map(attribute='c') | join }}",
                   {{"xs", {{{"role", "user"}, {"c", "1"}}, {{"role", "bot"}, {"c", "2"}}}}}),
            "1");
}

TEST(Jinja, MacrosAndSetBlocks) {
  EXPECT_EQ(render("{% macro greet(name, punct='!') %}Hi {{ name }}{{ punct }}{% endmacro %}{{ greet('a') }} {{ greet('b', punct='?') }}"),
            "Hi a! Hi b?");
  EXPECT_EQ(render("{% set block %}x{{ 1 }}y{% endset %}[{{ block }}]"), "[x1y]");
}

TEST(Jinja, RaiseExceptionAndStrftime) {
  try {
    render("{{ raise_exception('roles must alternate') }}");
    FAIL() << "expected an exception";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("roles must alternate"), std::string::npos);
  }
  EXPECT_EQ(render("{{ strftime_now('%Y') | length }}"), "4");
}

TEST(Jinja, SyntaxErrorsNamePosition) {
  try {
    Template("line one\n{% if x %}\n{{ x + }}\n{% endif %}");
    FAIL() << "expected a syntax error";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("line 3"), std::string::npos) << e.what();
  }
  EXPECT_THROW(Template("{% for x in y %}no end"), ConfigError);
  EXPECT_THROW(Template("{% frobnicate %}"), ConfigError);
  EXPECT_THROW(Template("{{ 'unterminated }}"), ConfigError);
  EXPECT_THROW(render("{{ x | nosuchfilter }}"), ConfigError);
}

}  // namespace
}  // namespace lmtune::jinja
