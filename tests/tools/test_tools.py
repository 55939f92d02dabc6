"""Tools: the registry (names, ``module:function``), schemas, argument checks, the calculator and the
sandboxed interpreter's limits (time, memory, network, writes outside its folder, processes, output)."""

from __future__ import annotations

import json
import os
import re
import textwrap
import time

import pytest

from posttrain.tools import (
    TOOLS,
    SandboxLimits,
    Tool,
    ToolError,
    calculate,
    get_tool,
    register_tool,
    run_python,
    run_sandboxed,
    tool_schema,
)
from posttrain.utils.errors import PosttrainError

FAST = SandboxLimits(timeout_s=2)


def sample(city: str, days: int = 3, metric: bool = True, threshold: float = 0.5) -> str:
    """Get the weather forecast for a city.

    A second paragraph that is not part of the description.

    Args:
        city: the city's name
        days: how many days
            to forecast
        metric: Celsius when true
        threshold: rain probability to report
    """
    return f"{city} {days} {metric} {threshold}"


# ------------------------------------------------------------------------------------------ registry
def test_builtin_tools_are_registered_by_name():
    assert {"python", "calculator"} <= set(TOOLS.names())
    calc = get_tool("calculator")
    assert isinstance(calc, Tool) and calc.name == "calculator" and calc.fn is calculate
    assert calc.call({"expression": "6*7"}) == "42"
    assert get_tool("python").call({"code": "print(6*7)"}).strip() == "42"


def test_register_tool_decorator_and_unknown_name():
    @register_tool("weather")
    def weather(city: str) -> str:
        """Say the weather."""
        return f"sunny in {city}"

    assert get_tool("weather").call('{"city": "Oslo"}') == "sunny in Oslo"
    with pytest.raises(PosttrainError, match=r"unknown tool 'wether'. Did you mean 'weather'"):
        get_tool("wether")


def test_tool_by_module_function_path(tmp_path, monkeypatch):
    (tmp_path / "my_tools.py").write_text(
        textwrap.dedent(
            '''
            def shout(text: str, times: int = 1) -> str:
                """Repeat a text in capitals."""
                return " ".join([text.upper()] * times)

            NOT_A_TOOL = 3
            '''
        )
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    tool = get_tool("my_tools:shout")
    assert tool.name == "shout" and tool.schema["function"]["name"] == "shout"
    assert tool.call({"text": "hi", "times": 2}) == "HI HI"
    assert get_tool("posttrain.tools.builtin:calculate").call({"expression": "1+1"}) == "2"
    with pytest.raises(PosttrainError, match=r"no attribute 'shuot'.*did you mean 'shout'"):
        get_tool("my_tools:shuot")
    with pytest.raises(PosttrainError, match="expected a function"):
        get_tool("my_tools:NOT_A_TOOL")


def test_unusable_signatures_are_refused_at_registration():
    def no_doc(x: int) -> str:
        return ""

    def no_annotation(x) -> str:
        """Doc."""

    def list_param(xs: list) -> str:
        """Doc."""

    with pytest.raises(ToolError, match="needs a docstring"):
        register_tool("no_doc")(no_doc)
    with pytest.raises(ToolError, match="parameter 'x' has no type annotation"):
        tool_schema(no_annotation)
    with pytest.raises(ToolError, match=r"parameter 'xs' is annotated .*str, int, float or bool"):
        get_tool(list_param)
    assert "no_doc" not in TOOLS


# -------------------------------------------------------------------------------------------- schema
def test_schema_of_a_sample_function():
    assert tool_schema(sample) == {
        "type": "function",
        "function": {
            "name": "sample",
            "description": "Get the weather forecast for a city.",
            "parameters": {
                "type": "object",
                "properties": {
                    "city": {"type": "string", "description": "the city's name"},
                    "days": {"type": "integer", "description": "how many days to forecast"},
                    "metric": {"type": "boolean", "description": "Celsius when true"},
                    "threshold": {"type": "number", "description": "rain probability to report"},
                },
                "required": ["city"],
            },
        },
    }
    assert tool_schema(sample, name="forecast")["function"]["name"] == "forecast"


def test_schema_matches_transformers_and_renders_in_a_chat_template():
    transformers = pytest.importorskip("transformers")
    from tokenizers import Tokenizer, models

    def add(a: int, b: float = 1.0) -> str:
        """Add two numbers.

        Args:
            a: the first number
            b: the second number
        """

    hf = transformers.utils.get_json_schema(add)
    hf["function"].pop("return", None)
    assert tool_schema(add) == hf

    tok = transformers.PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer(models.WordLevel({"[UNK]": 0}, unk_token="[UNK]"))
    )
    tok.chat_template = (
        "{% for t in tools %}{{ t.function.name }}({{ t.function.parameters.required | join(',') }}) "
        "{% endfor %}{% for m in messages %}{{ m.content }}{% endfor %}"
    )
    text = tok.apply_chat_template(
        [{"role": "user", "content": "hi"}], tools=[get_tool("calculator").schema], tokenize=False
    )
    assert text == "calculator(expression) hi"


# ----------------------------------------------------------------------------------------- arguments
@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ({"city": "Oslo", "dayz": 2}, r"tool 'sample': unknown argument\(s\) 'dayz'"),
        ({"days": 2}, r"tool 'sample': missing required argument\(s\) 'city'"),
        ({"city": 3}, "tool 'sample': argument 'city' must be string, got int"),
        ({"city": "Oslo", "days": "two"}, "tool 'sample': argument 'days' must be integer, got str"),
        ({"city": "Oslo", "days": True}, "argument 'days' must be integer, got bool"),
        ({"city": "Oslo", "metric": "yes"}, "argument 'metric' must be boolean"),
        ({"city": "Oslo", "threshold": "high"}, "argument 'threshold' must be number"),
        ('{"city": "Oslo"', "tool 'sample': arguments are not valid JSON"),
        ("[1, 2]", "tool 'sample': arguments must be a JSON object, got list"),
    ],
)
def test_bad_arguments_raise_a_tool_error_naming_the_argument(arguments, message):
    tool = get_tool(sample)
    with pytest.raises(ToolError, match=message):
        tool.call(arguments)
    result = tool.invoke(arguments)  # never raises
    assert not result.ok and "tool 'sample'" in result.text


def test_arguments_are_coerced_where_json_is_loose():
    tool = get_tool(sample)
    assert tool.call({"city": "Oslo", "days": 2.0, "threshold": 1}) == "Oslo 2 True 1.0"
    assert tool.call(json.dumps({"city": "Oslo"})) == "Oslo 3 True 0.5"
    assert tool(city="Rome", metric=False) == "Rome 3 False 0.5"


def test_an_exception_inside_a_tool_becomes_a_tool_error():
    def broken(x: int) -> str:
        """Divide by x."""
        return str(1 / x)

    tool = get_tool(broken)
    with pytest.raises(ToolError, match="tool 'broken' raised ZeroDivisionError"):
        tool.call({"x": 0})
    assert tool.invoke({"x": 4}).text == "0.25"


# ---------------------------------------------------------------------------------------- calculator
@pytest.mark.parametrize(
    ("expression", "value"),
    [
        ("1 + 2 * 3", "7"),
        ("(1234 * 5678 - 91) / 7", "1000937.28571429"),
        ("-3 ** 2", "-9"),
        ("(-2) ** 3", "-8"),
        ("7 // 2", "3"),
        ("-7 % 3", "2"),
        ("0.1 + 0.2", "0.3"),
        ("2 ** -2", "0.25"),
        ("3847 * 2918 + 1111", "11226657"),
        ("2 ** 100", str(2**100)),
        ("+5", "5"),
    ],
)
def test_calculator_values(expression, value):
    assert calculate(expression) == value


@pytest.mark.parametrize(
    ("expression", "message"),
    [
        ("__import__('os')", "function calls are not allowed"),
        ("__import__('os').system('true')", "not allowed"),
        ("x + 1", "names are not allowed"),
        ("(1).__class__", "attributes are not allowed"),
        ("2 ** 10 ** 10", "too large"),
        ("(10 ** 1000) ** 1000", "too large"),
        ("1e308 * 10", "too large"),
        ("1 / 0", "division by zero"),
        ("2 ^ 3", "use \\*\\* for powers"),
        ("1,234 + 1", "thousands separators"),
        ("'a' * 3", "only numbers"),
        ("(-8) ** 0.5", "not a real number"),
        ("1 +", "invalid expression"),
        ("", "empty expression"),
        ("(" * 500 + "1" + ")" * 500, "error"),
        ("1 < 2", "comparisons are not allowed"),
    ],
)
def test_calculator_refusals_are_messages(expression, message):
    out = calculate(expression)
    assert out.startswith("error:")
    assert re.search(message, out), out


def test_calculator_refuses_a_huge_power_quickly():
    start = time.perf_counter()
    assert calculate("9 ** 9 ** 9").startswith("error:")
    assert time.perf_counter() - start < 0.5


# ------------------------------------------------------------------------------------------- sandbox
def test_sandbox_prints_and_cleans_its_folder():
    r = run_sandboxed("import os\nprint(6 * 7)\nprint(os.getcwd())", FAST)
    assert r.ok and r.returncode == 0 and r.limit is None
    answer, cwd = r.stdout.split()
    assert answer == "42"
    assert os.path.basename(cwd) == "work" and not os.path.exists(os.path.dirname(cwd))
    assert run_python("x = 1") == "[no output]"


def test_sandbox_exception_returns_the_error_line():
    out = run_python("a = 1\nprint('before')\nb = a / 0\n", FAST)
    assert out == "before\nZeroDivisionError: division by zero (line 3)"
    assert "SyntaxError" in run_python("x = (", FAST)


def test_sandbox_infinite_loop_is_killed_by_the_time_limit():
    start = time.monotonic()
    r = run_sandboxed("print('started', flush=True)\nwhile True: pass", FAST)
    elapsed = time.monotonic() - start
    assert r.limit == "time" and r.returncode == -9
    assert r.text == "started\n[killed: time limit 2 s]"
    assert 1.9 < elapsed < 4.0
    assert run_python("print('next')", FAST).strip() == "next"  # the run goes on


def test_sandbox_cpu_time_limit():
    r = run_sandboxed("while True: pass", SandboxLimits(timeout_s=10, cpu_time_s=1))
    # CPU seconds, not wall seconds: a busy machine stretches them
    assert r.limit == "cpu" and r.elapsed_s < 9
    assert "[killed: CPU time limit 1 s]" in r.text


def test_sandbox_huge_allocation_is_refused_by_the_memory_limit():
    r = run_sandboxed("data = b'x' * 10**10\nprint('allocated')", FAST)
    assert r.limit == "memory" and "allocated" not in r.text
    assert r.text == "MemoryError (line 1)\n[memory limit 512 MiB]"
    small = run_python("print(len(b'x' * 10**7))", FAST)
    assert small.strip() == str(10**7)


@pytest.mark.parametrize(
    "code",
    [
        "import socket\nsocket.socket()",
        "import socket\nsocket.create_connection(('127.0.0.1', 9))",
        "import socket\nsocket.getaddrinfo('localhost', 80)",
        "import _socket\n_socket.socket()",
        "import urllib.request\nurllib.request.urlopen('http://127.0.0.1:9')",
    ],
)
def test_sandbox_refuses_network(code):
    out = run_python(code, FAST)
    assert "sandbox: network access is disabled" in out, out


def test_sandbox_refuses_writes_outside_its_folder(tmp_path):
    # the guard's own refusals (under bwrap the host's folders are not there at all:
    # tests/tools/test_sandbox_escapes.py)
    target = tmp_path / "escaped.txt"
    for code in (
        f"open({str(target)!r}, 'w').write('x')",
        f"import os\nos.open({str(target)!r}, os.O_WRONLY | os.O_CREAT)",
        f"import os\nos.chdir({str(tmp_path)!r})\nopen('escaped.txt', 'a')",
        f"import os\nos.symlink({str(tmp_path)!r}, 'link')\nopen('link/escaped.txt', 'w')",
    ):
        out = run_python(code, FAST, backend="guard")
        assert "PermissionError: sandbox:" in out and "outside the working folder" in out, out
    assert not target.exists()
    (tmp_path / "keep.txt").write_text("keep")
    out = run_python(f"import os\nos.remove({str(tmp_path / 'keep.txt')!r})", FAST, backend="guard")
    assert "os.remove outside the working folder is not allowed" in out
    assert (tmp_path / "keep.txt").read_text() == "keep"


def test_sandbox_writes_inside_its_folder_work():
    code = (
        "import os, shutil\nopen('a.txt', 'w').write('hello')\nos.makedirs('d/e')\n"
        "open('d/e/f.txt', 'w').close()\nshutil.rmtree('d')\nprint(open('a.txt').read(), os.listdir())"
    )
    assert run_python(code, FAST).strip() == "hello ['a.txt']"


@pytest.mark.parametrize(
    ("code", "event"),
    [
        ("import subprocess\nsubprocess.run(['true'])", "subprocess.Popen"),
        ("import os\nos.system('true')", "os.system"),
        ("import os\nos.fork()", "os.fork"),
        ("import os\nos.execv('/bin/true', ['true'])", "os.exec"),
        ("import os\nos.kill(os.getppid(), 9)", "os.kill"),
        ("import resource\nresource.setrlimit(resource.RLIMIT_AS, (-1, -1))", "resource.setrlimit"),
    ],
)
def test_sandbox_refuses_processes_signals_and_raising_its_limits(code, event):
    out = run_python(code, FAST)
    assert f"PermissionError: sandbox: {event} is not allowed" in out, out


def test_sandbox_refuses_ctypes_but_numpy_imports():
    assert "ImportError: sandbox: module ctypes is disabled" in run_python("import ctypes", FAST)
    pytest.importorskip("numpy")
    assert run_python("import numpy as np\nprint(int(np.arange(5).sum()))", FAST).strip() == "10"


def test_sandbox_truncates_huge_output():
    r = run_sandboxed("print('y' * 1_000_000)", FAST)
    assert r.truncated and r.stdout == "y" * 4000
    assert r.text.endswith("[output truncated: 4000 characters shown of 1000001 bytes written]")
    assert len(r.text) < 4200
    r = run_sandboxed("import sys\nprint('o' * 10_000)\nsys.stderr.write('e' * 10_000)", FAST)
    assert len(r.stdout) + len(r.stderr) <= 4000 + 3 and r.stderr.startswith("...e")


def test_sandbox_file_size_limit():
    r = run_sandboxed("open('big', 'wb').write(b'0' * (2 << 20))", SandboxLimits(timeout_s=2, max_file_mb=1))
    assert r.limit == "file size" and "[file size limit 1 MiB]" in r.text


def test_sandbox_limits_are_frozen():
    with pytest.raises(AttributeError):
        FAST.timeout_s = 10  # type: ignore[misc]
    assert SandboxLimits().cpu_seconds == 6 and SandboxLimits(timeout_s=2.5).cpu_seconds == 4
