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

// What a template (code from the internet) asks for beyond the bounds is a clear error, not a crash, a hang or
// unbounded memory: nesting, recursion, loop work and string size.
std::string error_of(const std::string& source) {
  try {
    render(source);
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}

TEST(Jinja, HostileTemplatesHitLimits) {
  auto repeat = [](const std::string& s, int n) {
    std::string r;
    for (int k = 0; k < n; ++k) r += s;
    return r;
  };
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"{{ " + repeat("(", 1000) + "1" + repeat(")", 1000) + " }}", "nested deeper than 100 levels"},
      {"{{ " + repeat("-", 1000) + "1 }}", "nested deeper than 100 levels"},
      {"{{ " + repeat("not ", 1000) + "x }}", "nested deeper than 100 levels"},
      {"{{ " + repeat("[", 10000) + repeat("]", 10000) + " }}", "more than 4,000 tokens"},
      {repeat("{% if true %}", 500) + repeat("{% endif %}", 500), "nested deeper than 100 levels"},
      {"{{ 1" + repeat(" + 1", 5000) + " }}", "more than 4,000 tokens"},
      {"{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}", "macros nest deeper than 100 calls"},
      {"{{ 'x' * 10**12 }}", "a string passes 64 MiB"},
      {"{% set ns = namespace(s='x') %}{% for i in range(40) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}",
       "a string passes 64 MiB"},
      {"{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
       "loops ran more than 1,000,000 iterations"},
      {"{{ range(10**9) | length }}", "range() of more than 1,000,000 numbers"},
      // Found by fuzz_chat_template (a stack overflow in repr): a namespace or list that would hold itself, which
      // shared containers could never free.
      {"{% set ns = namespace(n=0) %}{% set ns.n = ns %}{{ ns }}", "a namespace cannot hold itself"},
      {"{% set l = [1] %}{% set _ = l.append([l]) %}", "a list cannot hold itself"},
      {"{% set a = namespace(n=0) %}{% set b = namespace(n=a) %}{% set a.n = b %}", "a namespace cannot hold itself"},
      {"{% set l = [] %}{% set _ = l.append(l.append) %}", "a list or namespace cannot hold a function"},
      {"{% set l = [] %}{% set _ = l.append({'f': l.append}) %}", "a list or namespace cannot hold a function"},
  };
  for (const auto& [source, want] : cases) {
    const std::string e = error_of(source);
    EXPECT_NE(e.find(want), std::string::npos) << source.substr(0, 60) << ": " << e;
  }
  // A namespace holding another, and deep but reasonable templates, still render.
  EXPECT_EQ(render("{% set a = namespace(n=1) %}{% set b = namespace(n=a) %}{% set b.m = [a, a] %}{{ b.m[1].n }}"),
            "1");
  EXPECT_EQ(render("{{ " + repeat("(", 50) + "1" + repeat(")", 50) + " }}"), "1");
  EXPECT_EQ(render("{% macro f(n) %}{% if n > 0 %}{{ f(n - 1) }}{% endif %}{{ n }}{% endmacro %}{{ f(50) }}").size(),
            size_t(92));
}

// Found by fuzz_chat_template (UBSan: signed overflow in `311 ** 30`): integer arithmetic past 64 bits is an error
// naming the operation, never a wrapped value; a huge exponent of 0, 1 or -1 is computed by squaring, not a loop.
TEST(Jinja, IntegerOverflowIsAnErrorAndPowersSquare) {
  for (const char* source : {"{{ 311 ** 30 }}", "{{ 9223372036854775807 + 1 }}", "{{ -9223372036854775807 - 2 }}",
                             "{{ 4294967296 * 4294967296 }}", "{{ (-9223372036854775807 - 1) // -1 }}"}) {
    const std::string e = error_of(source);
    EXPECT_NE(e.find("integer overflow in"), std::string::npos) << source << ": " << e;
  }
  EXPECT_EQ(render("{{ 2 ** 62 }}|{{ (-2) ** 63 }}|{{ 1 ** 9000000000000000000 }}|{{ (-1) ** 9000000000000000001 }}|"
                   "{{ 0 ** 0 }}|{{ 3 ** 39 }}|{{ (-1) ** 2 }}"),
            "4611686018427387904|-9223372036854775808|1|-1|1|4052555153018976267|1");
}

// Found by fuzz_chat_template: a literal too large for int64 or double escaped as std::out_of_range (stoll).
TEST(Jinja, OutOfRangeNumberLiteralsAreSyntaxErrors) {
  const std::string sources[] = {"{{ 99999999999999999999 }}", "{{ x(1, 9223372036854775808) }}",
                                 "{{ " + std::string(400, '9') + ".5 }}"};
  for (const std::string& source : sources) {
    const std::string e = error_of(source);
    EXPECT_NE(e.find("line 1, column"), std::string::npos) << source.substr(0, 40) << ": " << e;
    EXPECT_NE(e.find("is out of range"), std::string::npos) << e;
  }
  EXPECT_EQ(render("{{ 9223372036854775807 }}|{{ 1_000 }}|{{ 2.5 }}"), "9223372036854775807|1000|2.5");
}

}  // namespace
}  // namespace lmtune::jinja
