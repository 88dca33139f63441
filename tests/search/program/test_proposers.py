"""Proposers: the offline operators, the OpenAI-compatible client against a scripted local
server (malformed replies included), diffs, replies that repeat the skeleton, and the
ensemble."""

import ast
import json
import re
import threading
import time
import typing
from http.server import BaseHTTPRequestHandler, HTTPServer

import pytest

from graded.search.program.offline import OPERATORS, OfflineProposer
from graded.search.program.program import Program
from graded.search.program.proposers import (
    EnsembleProposer,
    OpenAIProposer,
    ProposalError,
    ProposerError,
    apply_diffs,
    parse_diffs,
    parse_function,
)

PARENT = Program(("def priority(el, n):\n    x = el[0] * 2.0\n    if x > 1:\n"
                  "        return x - n\n    return 0.5\n",))
OTHER = Program(("def priority(el, n):\n    y = sum(el)\n    return y * 3.0\n",))


@pytest.mark.parametrize("operator", OPERATORS)
def test_each_offline_operator_makes_valid_new_programs(operator):
    proposer = OfflineProposer(seed=0, operators=(operator,))
    count = 2 if operator == "delete" else 5  # PARENT has two deletable statements
    children = {proposer.propose([OTHER, PARENT])[0] for _ in range(count)}
    assert len(children) == count  # varied: never the same child twice
    for child in children:
        ast.parse(child.blocks[0])
        assert child not in (PARENT, OTHER)


def test_offline_operators_change_what_they_name():
    def body(program):
        return ast.dump(ast.parse(program.blocks[0]))

    child, _ = OfflineProposer(seed=1, operators=("comparison",)).propose([PARENT])
    assert body(child) != body(PARENT) and "Gt()" not in body(child)
    def statements(program):
        return sum(isinstance(n, ast.stmt) for n in ast.walk(ast.parse(program.blocks[0])))

    child, _ = OfflineProposer(seed=1, operators=("delete",)).propose([PARENT])
    assert statements(child) < statements(PARENT)
    child, _ = OfflineProposer(seed=1, operators=("insert",)).propose([PARENT])
    assert statements(child) > statements(PARENT)
    child, _ = OfflineProposer(seed=1, operators=("constant",)).propose([PARENT])
    constants = [n.value for n in ast.walk(ast.parse(child.blocks[0]))
                 if isinstance(n, ast.Constant)]
    assert constants != [2.0, 1, 0.5]


def test_offline_proposer_is_reproducible_and_resumable():
    a, b = OfflineProposer(seed=7), OfflineProposer(seed=7)
    first = [a.propose([OTHER, PARENT])[0] for _ in range(5)]
    assert first == [b.propose([OTHER, PARENT])[0] for _ in range(5)]
    c = OfflineProposer(seed=0)
    c.load_state(a.state())
    assert a.propose([OTHER, PARENT]) == c.propose([OTHER, PARENT])


def test_diffs_apply_and_malformed_diffs_are_rejected():
    reply = ("<<<<<<< SEARCH\n    return 0.5\n=======\n    return 0.75\n>>>>>>> REPLACE\n")
    child = apply_diffs(PARENT, parse_diffs(reply))
    assert "return 0.75" in child.blocks[0]
    with pytest.raises(ProposalError, match="malformed"):
        parse_diffs("<<<<<<< SEARCH\n    return 0.5\n>>>>>>> REPLACE\n")
    with pytest.raises(ProposalError, match="not found"):
        apply_diffs(PARENT, [("return 42", "return 1")])
    with pytest.raises(ProposalError, match="ambiguous"):
        apply_diffs(Program(("a = 1\na = 1\n",)), [("a = 1", "a = 2")])


def test_whole_function_replies_are_parsed_and_renamed():
    text = "Here you go:\n```python\ndef priority_v2(el, n):\n    return -sum(el)\n```\n"
    code = parse_function(text, "priority")
    assert "def priority(el, n)" in code and "priority_v2" not in code
    with pytest.raises(ProposalError, match="does not parse"):
        parse_function("```python\ndef priority(el, n)\n    return 1\n```", "priority")
    with pytest.raises(ProposalError, match="no function"):
        parse_function("I cannot help with that.", "priority")


class Scripted(BaseHTTPRequestHandler):
    """Answers POST /v1/chat/completions with the next scripted (status, content)."""

    script: typing.ClassVar[list] = []
    seen: typing.ClassVar[list] = []

    def do_POST(self):
        length = int(self.headers["Content-Length"])
        Scripted.seen.append((json.loads(self.rfile.read(length)),
                              self.headers.get("Authorization")))
        status, content = Scripted.script.pop(0)
        if status == "raw":  # the whole reply, as bytes: broken HTTP
            self.wfile.write(content)
            return
        if status == "drip":  # a complete reply, one byte every 20 ms
            body = json.dumps({"choices": [{"message": {"content": content}}]}).encode()
            self.wfile.write(b"HTTP/1.0 200 OK\r\nContent-Length: %d\r\n\r\n" % len(body))
            for i in range(len(body)):
                self.wfile.write(body[i:i + 1])
                self.wfile.flush()
                time.sleep(0.02)
            return
        if status != 200:
            self.send_response(status)
            self.end_headers()
            return
        body = content if isinstance(content, bytes) else json.dumps(
            {"choices": [{"message": {"role": "assistant", "content": content}}]}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture
def server():
    httpd = HTTPServer(("127.0.0.1", 0), Scripted)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    Scripted.seen = []
    yield f"http://127.0.0.1:{httpd.server_address[1]}/v1"
    httpd.shutdown()


def test_openai_proposer_against_a_scripted_server(server, monkeypatch):
    monkeypatch.setenv("TEST_KEY", "sk-test")
    Scripted.script = [
        (503, None),                                    # retried with back-off
        (200, "no code here"),                          # rejected: no function
        (200, b"{not json"),                            # not a chat completion
    ]
    proposer = OpenAIProposer(base_url=server, model="m", api_key_env="TEST_KEY",
                              backoff_s=0.01, retries=2)
    with pytest.raises(ProposalError, match="not a chat completion"):
        proposer.propose([PARENT], "prompt")
    assert proposer.rejected == {"the reply contains no function": 1}
    assert Scripted.seen[0][1] == "Bearer sk-test" and Scripted.seen[0][0]["model"] == "m"
    Scripted.script = [
        (200, "<<<<<<< SEARCH\n    return 0.5\n=======\n    return 0.25\n>>>>>>> REPLACE"),
        (200, "```python\ndef priority_v1(el, n):\n    return 1.0\n```"),
    ]
    child, op = proposer.propose([PARENT], "prompt")
    assert "return 0.25" in child.blocks[0] and op == "openai"
    child, _ = proposer.propose([PARENT], "prompt")
    assert child.blocks[0].strip() == "def priority(el, n):\n    return 1.0"


def test_openai_budget_and_client_errors(server):
    Scripted.script = [(400, None)]
    proposer = OpenAIProposer(base_url=server, model="m", max_requests=1, backoff_s=0.0)
    with pytest.raises(RuntimeError, match="HTTP 400"):
        proposer.complete("x")
    with pytest.raises(RuntimeError, match="budget"):
        proposer.complete("x")
    with pytest.raises(ValueError, match="base_url"):
        OpenAIProposer(base_url="127.0.0.1:8000", model="m")


def test_ensemble_samples_members_by_weight():
    class Fixed:
        def __init__(self, name):
            self.name = name

        def propose(self, parents, prompt=""):
            return parents[-1], "same"

        def state(self):
            return {}

        def load_state(self, state):
            pass

    ensemble = EnsembleProposer([Fixed("a"), Fixed("b")], [3.0, 1.0], seed=0)
    ops = [ensemble.propose([PARENT])[1] for _ in range(4000)]
    assert abs(ops.count("a:same") / 4000 - 0.75) < 0.03
    with pytest.raises(ValueError, match="weights"):
        EnsembleProposer([Fixed("a")], [-1.0])


def _completion(content) -> bytes:
    message = {"role": "assistant", "content": content}
    return json.dumps({"choices": [{"message": message}]}).encode()


def test_a_reply_without_text_is_rejected_and_retried_not_a_type_error(server):
    # content null is what a refusal or a reply cut at its token limit gives; a list of text
    # parts is what some compatible servers send
    Scripted.script = [(200, _completion(None)),
                       (200, _completion([{"type": "text", "text": "```python\n"},
                                          {"type": "text", "text": "def priority_v2(el, n):\n"
                                           "    return 3.0\n```"}]))]
    proposer = OpenAIProposer(base_url=server, model="m", retries=2, backoff_s=0.0)
    child, _ = proposer.propose([PARENT], "prompt")
    assert child.blocks[0].strip() == "def priority(el, n):\n    return 3.0"
    assert proposer.rejected == {"the reply has no text": 1} and proposer.budget.used == 2
    Scripted.script = [(200, _completion({"text": "x"}))]
    with pytest.raises(ProposalError, match="not a chat completion: message content is"):
        proposer.propose([PARENT], "prompt")


@pytest.mark.parametrize("broken", [
    b"this is not http at all\r\n\r\n",                                    # BadStatusLine
    b"HTTP/1.0 200 OK\r\nContent-Length: 1000\r\n\r\n" + _completion("x")[:20],  # cut short
])
def test_broken_http_replies_are_retried_like_connection_errors(server, broken):
    reply = "```python\ndef priority(el, n):\n    return 4.0\n```"
    Scripted.script = [("raw", broken), (200, reply)]
    proposer = OpenAIProposer(base_url=server, model="m", retries=1, backoff_s=0.0)
    child, _ = proposer.propose([PARENT], "prompt")
    assert "return 4.0" in child.blocks[0] and proposer.budget.used == 2
    Scripted.script = [("raw", broken), ("raw", broken)]
    with pytest.raises(ProposerError, match="failed after 2 attempts"):
        proposer.complete("prompt")


def test_timeout_bounds_the_whole_reply_not_each_read(server):
    # a reply of ~80 bytes at one byte per 20 ms takes ~1.6 s; every single read is fast
    Scripted.script = [("drip", "def priority(el, n):\n    return 1.0\n")]
    proposer = OpenAIProposer(base_url=server, model="m", retries=0, timeout_s=0.5)
    start = time.monotonic()
    with pytest.raises(ProposerError, match=re.escape("took longer than 0.5 s")):
        proposer.complete("prompt")
    assert time.monotonic() - start < 1.2


@pytest.mark.parametrize("kwargs,message", [
    ({"max_requests": 0}, "max_requests=0; expected an integer >= 1"),
    ({"retries": -1}, "retries=-1; expected an integer >= 0"),
    ({"timeout_s": 0}, "timeout_s=0; expected a positive number of seconds"),
    ({"backoff_s": -1.0}, "backoff_s=-1.0; expected a number of seconds >= 0"),
])
def test_openai_settings_are_checked_with_the_bad_value(kwargs, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        OpenAIProposer(base_url="http://127.0.0.1:1/v1", model="m", **kwargs)


def test_a_reply_that_is_all_code_keeps_its_imports():
    code = "import math\n\n\ndef priority(el, n):\n    return math.fsum(el)\n"
    assert parse_function(code, "priority") == code
    assert parse_function("Try this: def priority(el, n):\n    return 1\n", "priority") == (
        "def priority(el, n):\n    return 1\n")


@pytest.mark.parametrize("fence", ["```Python\n", "```python3\n", "``` python\n", "```py \n",
                                   "```python\r\n"])
def test_fenced_replies_with_any_info_string_are_taken(server, fence):
    # what chat models write: a capitalised or versioned language tag, a space, CRLF line ends
    newline = "\r\n" if fence.endswith("\r\n") else "\n"
    body = ["def priority_v2(el, n):", "    return float(el[0]) - 0.5"]
    Scripted.script = [(200, "Sure." + newline + fence + newline.join(body) + newline + "```")]
    proposer = OpenAIProposer(base_url=server, model="m", retries=0)
    child, _ = proposer.propose([PARENT], "prompt")
    assert child.blocks == ("def priority(el, n):\n    return float(el[0]) - 0.5\n",)
    assert proposer.rejected == {} and len(Scripted.seen) == 1
