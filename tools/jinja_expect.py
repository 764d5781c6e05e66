#!/usr/bin/env python3
"""Writes tests/data/jinja/expected.json: what Jinja2 renders for each case of
test_jinja (tests/unit/test_jinja.c), set up as Hugging Face transformers'
apply_chat_template sets it up (an ImmutableSandboxedEnvironment with
trim_blocks, lstrip_blocks and loop controls; raise_exception, strftime_now;
tojson as json.dumps(ensure_ascii=False); messages, tools=None,
documents=None, add_generation_prompt, bos_token, eos_token).

  tools/jinja_expect.py          rewrite the file
  tools/jinja_expect.py --check  rerender and compare with the file (ctest
                                 jinja_expect): exit 1 on a difference, 77
                                 when jinja2 is not installed

The cases: the chat templates of tests/data/jinja/*.jinja (SmolLM2's,
Gemma 3's, Qwen3-0.6B's, SmolLM3-3B's and LFM2.5-Instruct's as the models ship them, Llama 3's,
one after Qwen2.5's) over a set of conversations (Qwen3's and SmolLM3's also
with enable_thinking unset, true and false), and small templates for each part of the subset
(docs/jinja.md). A case Jinja2 refuses records "error": its message; the C
interpreter must refuse it too. Tooling only.
"""
import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DATA = os.path.join(ROOT, "tests", "data", "jinja")
OUT = os.path.join(DATA, "expected.json")

CHAT_TEMPLATES = {"smollm2.jinja": ("<|im_start|>", "<|im_end|>"), "gemma3.jinja": ("<bos>", "<eos>"),
                  "llama3.jinja": ("<|begin_of_text|>", "<|eot_id|>"), "qwen25.jinja": ("", "<|im_end|>"),
                  "qwen3.jinja": ("", "<|im_end|>"), "smollm3.jinja": ("", "<|im_end|>"),
                  "lfm2.jinja": ("<|startoftext|>", "<|im_end|>")}

# Qwen3's and SmolLM3's thinking switch: enable_thinking (their chat_template_kwargs), an earlier answer
# with its <think> block (dropped from the history), /no_think in the system prompt (SmolLM3)
THINKING = {
    "think_history": [{"role": "user", "content": "What is 2+2?"},
                      {"role": "assistant", "content": "<think>\nSmall sum.\n</think>\n\n4"},
                      {"role": "user", "content": "And 3+3?"}],
    "no_think_system": [{"role": "system", "content": "Be brief. /no_think"}, {"role": "user", "content": "Hi"}],
}

CONVERSATIONS = {
    "user": [{"role": "user", "content": "Hi there"}],
    "system_user": [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Hi there"}],
    "multi_turn": [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Hi there"},
                   {"role": "assistant", "content": "Hello!"}, {"role": "user", "content": "  What is 2+2?\n"}],
    "multi_turn_no_system": [{"role": "user", "content": "One"}, {"role": "assistant", "content": "Two"},
                             {"role": "user", "content": "Three"}],
    "unicode": [{"role": "user", "content": "Grüß dich 👋 — 日本語のテキスト\t\n"},
                {"role": "assistant", "content": "  Ça va ? ✓ "}, {"role": "user", "content": "Ελληνικά"}],
    "empty_content": [{"role": "system", "content": ""}, {"role": "user", "content": ""}],
    "specials_in_text": [{"role": "user", "content": "{{ not a tag }} {% nor this %} <|im_end|> '\"\\"}],
    "content_parts": [{"role": "system", "content": [{"type": "text", "text": "Read the scan."}]},
                      {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": " What is it? "}]}],
    "not_alternating": [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}],
}

TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather of a city",
                                           "parameters": {"type": "object",
                                                          "properties": {"city": {"type": "string"}},
                                                          "required": ["city"]}}}]

# Small templates, each on one part of the subset (rendered with FEATURE_CONTEXT).
FEATURES = {
    "arithmetic": "{{ 1 + 2 * 3 }} {{ 7 // 2 }} {{ -7 // 2 }} {{ 7 % 3 }} {{ -7 % 3 }} {{ 2 ** 10 }} {{ 7 / 2 }} "
                  "{{ 1.5 + 1 }} {{ 0.1 + 0.2 }} {{ 1e20 }} {{ 1e-5 }} {{ 100.0 }} {{ -0.5 }} {{ 10 - 3 - 2 }}",
    "strings_and_reprs": "{{ 'a' ~ 1 ~ none ~ true }} {{ 'ab' * 3 }} {{ [1, 'x', none, true, 2.5, \"it's\"] }} "
                         "{{ {'k': 'v', 'n': [1]} }} {{ 'it' 's' }} {{ \"esc: \\t|\\x41|\\u00e9|\\\\\" }}",
    "comparisons": "{{ 'x' in 'xyz' }} {{ 'q' not in ['a'] }} {{ 'k' in {'k': 1} }} {{ 1 == 1.0 }} {{ true == 1 }} "
                   "{{ 'a' < 'b' }} {{ 3 >= 4 }} {{ [1, 2] == [1, 2] }} {{ none == none }} {{ 'a' != 'a' }}",
    "tests": "{{ undefined_var is defined }} {{ messages is defined }} {{ none is none }} {{ 'x' is string }} "
             "{{ 3 is number }} {{ 3 is integer }} {{ 3.0 is float }} {{ true is boolean }} {{ [] is iterable }} "
             "{{ {} is mapping }} {{ 4 is even }} {{ 3 is odd }} {{ 9 is divisibleby 3 }} {{ 'x' is not string }} "
             "{{ tools is none }} {{ tools is defined }} {{ 'ab' is lower }} {{ 3 is eq 3 }} {{ 'a' is in 'abc' }}",
    "filters": "{{ '  pad  ' | trim }}|{{ 'xxhixx' | trim('x') }}|{{ undefined_var | default('dflt') }}|"
               "{{ '' | default('e', true) }}|{{ 'Hello' | lower }}|{{ 'hello world' | title }}|"
               "{{ 'hello' | capitalize }}|{{ 'up' | upper }}|{{ messages | length }}|{{ 'héllo' | length }}|"
               "{{ [3, 1, 2] | join('-') }}|{{ 'abc' | list }}|{{ [1, 2, 3] | reverse | list }}|"
               "{{ [1, 2, 3] | first }}|{{ 'xyz' | last }}|{{ -3 | abs }}|{{ '42' | int + 1 }}|{{ 3 | float }}|"
               "{{ 5 | string ~ '!' }}|{{ 'a-b' | replace('-', '+') }}|{{ 'x' | safe }}|{{ messages | count }}",
    "tojson": "{{ {'b': 1, 'a': [1, 2.5, none, true, 'q\"\\n'], 'u': 'é✓'} | tojson }} "
              "{{ [1, {'x': 'é'}] | tojson(indent=2) }} {{ messages[0] | tojson }} {{ 'a\\u0001b' | tojson }}",
    "dicts_and_methods": "{% for k, v in {'one': 1, 'two': 2} | items %}{{ k }}={{ v }};{% endfor %} "
                         "{% for k, v in {'one': 1}.items() %}{{ k }}:{{ v }}{% endfor %} {{ {'a': 1}.get('a') }} "
                         "{{ {'a': 1}.get('b', 'no') }} {{ {'a': 1}.keys() | list }} {{ {'a': 1}.values() | list }} "
                         "{{ messages[0].role }} {{ messages[0]['content'] }} {{ messages[9] }}|{{ messages[-1].role }}",
    "string_methods": "{{ 'a,b,,c'.split(',') }} {{ '  a b  '.split() }} {{ 'a b c'.split(' ', 1) }} {{ 'x'.upper() }} "
                      "{{ '--x--'.strip('-') }} {{ 'abc'.startswith('ab') }} {{ 'abc'.endswith('bc') }} "
                      "{{ 'aXbXc'.replace('X', '-') }} {{ '  l'.lstrip() }}|{{ 'r  '.rstrip() }}| {{ 'AbC'.lower() }} "
                      "{{ 'one two'.title() }} {{ 'think</think>answer'.split('</think>')[-1] }}",
    "slices": "{{ messages[1:] | length }} {{ 'abcdef'[1:4] }} {{ 'abcdef'[::-1] }} {{ 'abcdef'[-2:] }} "
              "{{ [1, 2, 3, 4, 5][::2] }} {{ [1, 2, 3, 4, 5][4:1:-2] }} {{ [1, 2, 3][:10] }} {{ 'héllo'[1:3] }} "
              "{{ [1, 2, 3][5:] }} {{ messages[::-1][0].role }}",
    "logic": "{{ 'yes' if messages else 'no' }} {{ 'x' if false }}| {{ none or 'fallback' }} {{ 0 and 'never' }} "
             "{{ not none }} {{ not 1 == 2 }} {{ (1 or 0) and 'both' }} {{ true and false or 'alt' }}",
    "loops": "{% for m in messages %}{{ loop.index }}/{{ loop.length }} {{ loop.index0 }} {{ loop.revindex }} "
             "{{ loop.revindex0 }} {{ loop.first }} {{ loop.last }} {{ loop.previtem.role if loop.previtem }} "
             "{{ m.role }};{% endfor %} {% for i in range(3) %}{{ i }}{% if i == 1 %}{% continue %}{% endif %}."
             "{% endfor %} {% for i in range(10) %}{% if i > 2 %}{% break %}{% endif %}{{ i }}{% endfor %} "
             "{% for i in range(5, 0, -2) %}{{ i }}{% endfor %} {% for x in [] %}never{% else %}empty-else{% endfor %} "
             "{% for x in [1, 2, 3, 4] if x is even %}{{ x }}/{{ loop.length }}{% endfor %} "
             "{% for c in 'héj' %}[{{ c }}]{% endfor %} {% for k in {'a': 1, 'b': 2} %}{{ k }}{% endfor %} "
             "{% for a in [1, 2] %}{% for b in [3, 4] %}{{ a }}{{ b }}{{ loop.index }} {% endfor %}{% endfor %}",
    "scoping": "{% set outer = 1 %}{% for i in [1] %}{% set outer = 2 %}{{ outer }}{% endfor %}{{ outer }} "
               "{% set ns = namespace(count=0, seen='') %}{% for m in messages %}{% set ns.count = ns.count + 1 %}"
               "{% set ns.seen = ns.seen ~ m.role[0] %}{% endfor %}{{ ns.count }} {{ ns.seen }} "
               "{% if true %}{% set in_if = 'leaks' %}{% endif %}{{ in_if }} "
               "{% set cap %}captured {{ 1 + 1 }}{% endset %}{{ cap | upper }} "
               "{% if false %}no{% elif true %}elif{% else %}else{% endif %} {# a comment #}"
               "{% generation %}gen{% endgeneration %}",
    "whitespace": "<ul>\n    {% for m in messages %}\n    <li>{{ m.role }}</li>\n    {% endfor %}\n</ul>\n"
                  "  {%+ if true %}kept-indent{% endif +%}\nafter-plus\n  {#- stripped comment -#}\n"
                  "   {{- ' tight ' -}}   \nend\n{% if true %}  \n  a  {{ 'b' }}\n{%- endif %}\n"
                  "\t{% if true %}\ttab\n\t{% endif %}\nx {% if true %}\ny{% endif %}\n\n",
    "crlf_and_trailing_newline": "a\r\n{% if true %}\r\nb\r\n{% endif %}\r\nc\rd\n",
    "raise_in_untaken_branch": "{% if false %}{{ raise_exception('never') }}{% endif %}ok",
    "bos_eos": "{{ bos_token }}|{{ eos_token }}|{{ add_generation_prompt }}",
    "strftime_format_only": "{{ strftime_now('%Y') | length }}",
}

FEATURE_ERRORS = {
    "unterminated_var": "a {{ messages",
    "unterminated_block": "{% if true %}x",
    "unknown_filter": "{{ 'x' | frobnicate }}",
    "unknown_test": "{{ 'x' is frobnicated }}",
    "unknown_statement": "{% frobnicate %}",
    "unclosed_string": "{{ 'abc }}",
    "raise": "{{ raise_exception('boom') }}",
    "type_error": "{{ 'a' + 1 }}",
    "undefined_attribute": "{{ nothing.here }}",
    "stray_endfor": "{% endfor %}",
    "set_on_non_namespace": "{% set x = {} %}{% set x.a = 1 %}",
    "zero_division": "{{ 1 // 0 }}",
}

FEATURE_CONTEXT_MESSAGES = [{"role": "system", "content": "S"}, {"role": "user", "content": "Hello"},
                            {"role": "assistant", "content": "Hi!"}]


def environment():
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message):
        from jinja2.exceptions import TemplateError
        raise TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def strftime_now(fmt):
        import datetime
        return datetime.datetime.now().strftime(fmt)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=["jinja2.ext.loopcontrols", Generation()])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


def Generation():
    """transformers' {% generation %} block (its AssistantTracker, less the tracking): renders its body."""
    from jinja2 import nodes
    from jinja2.ext import Extension

    class GenerationExt(Extension):
        tags = {"generation"}

        def parse(self, parser):
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
            return nodes.CallBlock(self.call_method("_render", []), [], [], body).set_lineno(lineno)

        def _render(self, caller):
            return caller()

    return GenerationExt


def context(messages, add_generation_prompt, bos, eos, tools=None):
    return {"messages": messages, "tools": tools, "documents": None, "add_generation_prompt": add_generation_prompt,
            "bos_token": bos, "eos_token": eos}


def render(env, source, ctx):
    try:
        return {"output": env.from_string(source).render(**ctx)}
    except Exception as e:  # noqa: BLE001 (any refusal is the expectation)
        return {"error": f"{type(e).__name__}: {e}"}


def cases():
    env = environment()
    out = []
    for name, (bos, eos) in CHAT_TEMPLATES.items():
        with open(os.path.join(DATA, name), encoding="utf-8", newline="") as f:
            source = f.read()
        for conv, messages in CONVERSATIONS.items():
            for gen in (True, False):
                ctx = context(messages, gen, bos, eos)
                out.append({"name": f"{name}/{conv}/{'gen' if gen else 'nogen'}", "template": name, "context": ctx,
                            **render(env, source, ctx)})
        if name in ("qwen25.jinja", "qwen3.jinja", "smollm3.jinja", "lfm2.jinja"):
            ctx = context(CONVERSATIONS["multi_turn"], True, bos, eos, TOOLS)
            out.append({"name": f"{name}/tools/gen", "template": name, "context": ctx, **render(env, source, ctx)})
        if name in ("qwen3.jinja", "smollm3.jinja"):
            for conv, messages in THINKING.items():
                for think in (None, True, False):
                    ctx = context(messages, True, bos, eos)
                    if think is not None:
                        ctx["enable_thinking"] = think
                    tag = "default" if think is None else "on" if think else "off"
                    out.append({"name": f"{name}/{conv}/think_{tag}", "template": name, "context": ctx,
                                **render(env, source, ctx)})
        if name == "lfm2.jinja":  # an earlier answer's <think> block dropped, or kept with keep_past_thinking
            for keep in (None, True):
                ctx = context(THINKING["think_history"], True, bos, eos)
                if keep is not None:
                    ctx["keep_past_thinking"] = keep
                out.append({"name": f"{name}/think_history/keep_{'default' if keep is None else 'on'}",
                            "template": name, "context": ctx, **render(env, source, ctx)})
    for name, source in {**FEATURES, **FEATURE_ERRORS}.items():
        ctx = context(FEATURE_CONTEXT_MESSAGES, True, "<s>", "</s>")
        out.append({"name": f"feature/{name}", "source": source, "context": ctx, **render(env, source, ctx)})
    return out


def dump(value):
    return json.dumps({"generator": "tools/jinja_expect.py", "cases": value}, indent=1, ensure_ascii=False) + "\n"


def main():
    try:
        import jinja2  # noqa: F401
    except ImportError:
        print("jinja_expect: jinja2 is not installed (pip install jinja2): skipped", file=sys.stderr)
        if "--check" in sys.argv:  # (the suite's summary line: tests/summary.sh adds them up)
            print("0 passed, 0 failed, 1 skipped")
            return 77
        return 2
    text = dump(cases())
    if "--check" in sys.argv:
        with open(OUT, encoding="utf-8") as f:
            old = f.read()
        if old != text:
            import difflib
            sys.stdout.writelines(difflib.unified_diff(old.splitlines(True), text.splitlines(True), OUT, "rendered now"))
            print("jinja_expect: tests/data/jinja/expected.json differs from what Jinja2 renders now", file=sys.stderr)
            print("0 passed, 1 failed, 0 skipped")
            return 1
        print(f"jinja_expect: {len(json.loads(text)['cases'])} cases agree with Jinja2")
        print("1 passed, 0 failed, 0 skipped")
        return 0
    with open(OUT, "w", encoding="utf-8", newline="\n") as f:
        f.write(text)
    print(f"wrote {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
