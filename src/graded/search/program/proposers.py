"""Proposers besides the offline one: a language model behind an OpenAI-compatible endpoint, and
an ensemble that samples proposers by weight.

:class:`OpenAIProposer` sends the database's prompt to ``{base_url}/chat/completions`` (any
OpenAI-compatible server: a hosted API, vLLM, llama.cpp, Ollama) and reads the reply as either

- a whole function (FunSearch): the first fenced code block, or the whole reply when it is
  code, or the reply from its first ``def``; the function named ``<name>_v<k>`` is renamed
  back to ``<name>``; or
- SEARCH/REPLACE diffs (AlphaEvolve)::

      <<<<<<< SEARCH
      exact lines of the current block
      =======
      replacement lines
      >>>>>>> REPLACE

  applied in order to the best parent's blocks; a SEARCH text that occurs in no block, or
  in a block more than once, rejects the reply with that reason.

Requests have a timeout (the whole reply must arrive within it, however slowly a server sends
it), are retried with exponential back-off on connection errors, broken HTTP replies, HTTP 429
and 5xx, and count against a request budget. A reply whose message has no text (``content``
null, as a refusal or a reply cut at its token limit gives) is rejected like one with no code.
When the endpoint gives no usable reply, :class:`ProposerError` says why. The API key is read
from an environment variable named by the caller (never stored in the run folder).

A whole-function reply that repeats the whole skeleton with the function filled in is trimmed
to its block by the evaluation (:func:`graded.search.program.echo.trim_echo`).
"""

from __future__ import annotations

import http.client
import json
import os
import re
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass

import numpy as np

from graded.search.program.program import (
    Program,
    block_functions,
    check_program,
    check_seed,
    rename_function,
)

__all__ = ["EnsembleProposer", "OpenAIProposer", "ProposalError", "ProposerError", "apply_diffs",
           "parse_diffs", "parse_function"]


class ProposalError(ValueError):
    """A reply that cannot be turned into a program; the message is the reason."""


class ProposerError(RuntimeError):
    """The endpoint gave no usable reply (unreachable, HTTP error, budget spent); the message
    says why. The search stops; its folder keeps the last finished round."""


_DIFF = re.compile(r"<{5,} SEARCH\n(.*?)\n?={5,}\n(.*?)\n?>{5,} REPLACE", re.DOTALL)
# any info string (```python, ```Python, ```python3, ``` py) and CRLF line ends
_FENCE = re.compile(r"```[ \t]*[\w+.-]*[ \t]*\r?\n(.*?)```", re.DOTALL)


def parse_diffs(text: str) -> list[tuple[str, str]]:
    """The (search, replace) pairs of a reply; ``ProposalError`` when there are markers but no
    well-formed diff."""
    pairs = [(m.group(1), m.group(2)) for m in _DIFF.finditer(text)]
    if not pairs and ("SEARCH" in text or "REPLACE" in text):
        raise ProposalError("malformed SEARCH/REPLACE diff (expected '<<<<<<< SEARCH', "
                            "'=======', '>>>>>>> REPLACE' lines)")
    return pairs


def apply_diffs(program: Program, pairs: list[tuple[str, str]]) -> Program:
    blocks = list(program.blocks)
    for search, replace in pairs:
        if not search.strip():
            raise ProposalError("a SEARCH section is empty")
        hits = [i for i, b in enumerate(blocks) if search in b]
        if not hits:
            raise ProposalError(f"SEARCH text not found in any block: {search[:80]!r}")
        if len(hits) > 1 or blocks[hits[0]].count(search) > 1:
            raise ProposalError(f"SEARCH text is ambiguous (occurs more than once): "
                                f"{search[:80]!r}")
        blocks[hits[0]] = blocks[hits[0]].replace(search, replace, 1)
    return Program(tuple(blocks))


def parse_function(text: str, name: str) -> str:
    """The function of a whole-function reply, renamed to ``name``: the first fenced code
    block, else the whole reply when it is code (it parses and defines a function), else the
    reply from its first ``def``."""
    fenced = _FENCE.findall(text)
    if fenced:
        code = fenced[0]
    elif "def " in text:
        code = text if check_program(text) is None else text[text.find("def "):]
    else:
        code = ""
    if not code.strip():
        raise ProposalError("the reply contains no function")
    reason = check_program(code)
    if reason is not None:
        raise ProposalError(f"the reply does not parse: {reason}")
    functions = block_functions(code)
    if not functions:
        raise ProposalError("the reply defines no function")
    versioned = [f for f in functions if re.fullmatch(rf"{re.escape(name)}(_v\d+)?", f)]
    chosen = versioned[-1] if versioned else functions[-1]
    return rename_function(code, chosen, name) if chosen != name else code


@dataclass
class _Budget:
    requests: int
    used: int = 0


class OpenAIProposer:
    """A language model proposer over an OpenAI-compatible chat-completions endpoint."""

    name = "openai"

    def __init__(self, *, base_url: str, model: str, api_key_env: str = "OPENAI_API_KEY",
                 max_requests: int = 1000, timeout_s: float = 60.0, retries: int = 3,
                 backoff_s: float = 1.0, temperature: float = 1.0,
                 system: str = "You write Python. Reply with code only.") -> None:
        if not base_url.startswith(("http://", "https://")):
            raise ValueError(f"base_url={base_url!r}; expected an http(s) URL")
        for label, value, least in (("max_requests", max_requests, 1), ("retries", retries, 0)):
            if isinstance(value, bool) or not isinstance(value, int) or value < least:
                raise ValueError(f"{label}={value!r}; expected an integer >= {least}")
        # a socket's timeout and time.sleep stop at threading.TIMEOUT_MAX (about 292 years):
        # inf was accepted here and every request then failed with an OverflowError
        if isinstance(timeout_s, bool) or not isinstance(timeout_s, (int, float)) \
                or not 0 < timeout_s <= threading.TIMEOUT_MAX:
            raise ValueError(f"timeout_s={timeout_s!r}; expected a positive number of seconds, "
                             f"at most {threading.TIMEOUT_MAX:g}")
        if isinstance(backoff_s, bool) or not isinstance(backoff_s, (int, float)) \
                or not 0 <= backoff_s * 2**retries <= threading.TIMEOUT_MAX:
            raise ValueError(f"backoff_s={backoff_s!r}; expected a number of seconds >= 0 whose "
                             f"last back-off, backoff_s·2^retries with retries={retries}, is "
                             f"at most {threading.TIMEOUT_MAX:g} s")
        self.url = base_url.rstrip("/") + "/chat/completions"
        self.model = model
        self.key = os.environ.get(api_key_env, "")
        self.budget = _Budget(max_requests)
        self.timeout_s = timeout_s
        self.retries = retries
        self.backoff_s = backoff_s
        self.temperature = temperature
        self.system = system
        self.rejected: dict[str, int] = {}

    def state(self) -> dict:
        return {"used": self.budget.used, "rejected": self.rejected}

    def load_state(self, state: dict) -> None:
        self.budget.used = state["used"]
        self.rejected = dict(state["rejected"])

    def complete(self, prompt: str) -> str:
        """One chat completion, with retries and back-off; counts against the budget."""
        if self.budget.used >= self.budget.requests:
            raise ProposerError(f"request budget of {self.budget.requests} exhausted")
        body = json.dumps({"model": self.model, "temperature": self.temperature,
                           "messages": [{"role": "system", "content": self.system},
                                        {"role": "user", "content": prompt}]}).encode()
        headers = {"Content-Type": "application/json"}
        if self.key:
            headers["Authorization"] = f"Bearer {self.key}"
        last: Exception | None = None
        for attempt in range(self.retries + 1):
            self.budget.used += 1
            request = urllib.request.Request(self.url, data=body, headers=headers, method="POST")
            try:
                data = json.loads(self._post(request))
                return _message_text(data["choices"][0]["message"])
            except urllib.error.HTTPError as e:
                last = e
                if e.code != 429 and e.code < 500:
                    raise ProposerError(f"{self.url} answered HTTP {e.code}: {e.reason}") from e
            except (urllib.error.URLError, TimeoutError, ConnectionError,
                    http.client.HTTPException) as e:
                # HTTPException: a reply cut short (IncompleteRead) or not HTTP (BadStatusLine)
                last = e
            except (KeyError, IndexError, TypeError, ValueError) as e:
                raise ProposalError(f"the endpoint's reply is not a chat completion: {e}") from e
            if attempt < self.retries and self.budget.used < self.budget.requests:
                time.sleep(self.backoff_s * 2**attempt)
            else:
                break
        raise ProposerError(f"{self.url} failed after {attempt + 1} attempts: "
                            f"{type(last).__name__}: {last}")

    def _post(self, request: urllib.request.Request) -> bytes:
        """The reply's body; ``TimeoutError`` when it is not complete within ``timeout_s`` (the
        socket timeout alone bounds each read, not a reply sent a byte at a time)."""
        deadline = time.monotonic() + self.timeout_s
        chunks = []
        with urllib.request.urlopen(request, timeout=self.timeout_s) as reply:
            expected = reply.length  # Content-Length, when the server sent one
            while chunk := reply.read1(65_536):
                chunks.append(chunk)
                if time.monotonic() > deadline:
                    raise TimeoutError(f"the reply took longer than {self.timeout_s:g} s")
        body = b"".join(chunks)
        if expected is not None and len(body) < expected:  # read1 stops quietly at a cut
            raise http.client.IncompleteRead(body, expected - len(body))
        return body

    def propose(self, parents: list[Program], prompt: str = "") -> tuple[Program, str]:
        best = parents[-1]
        for _ in range(self.retries + 1):
            text = self.complete(prompt)
            try:
                return self.parse(text, best), "openai"
            except ProposalError as e:
                reason = str(e).split(":")[0]
                self.rejected[reason] = self.rejected.get(reason, 0) + 1
        raise ProposerError(f"no usable reply in {self.retries + 1} requests "
                            f"(rejections: {self.rejected})")

    @staticmethod
    def parse(text: str, best: Program) -> Program:
        """The program a reply describes: diffs against ``best``, or a whole function."""
        if not text.strip():
            raise ProposalError("the reply has no text")
        text = text.replace("\r\n", "\n")  # a server's CRLF line ends
        pairs = parse_diffs(text)
        if pairs:
            child = apply_diffs(best, pairs)
        else:
            if len(best.blocks) != 1:
                raise ProposalError("several evolvable blocks need SEARCH/REPLACE diffs")
            names = block_functions(best.blocks[0])
            child = Program((parse_function(text, names[0] if names else "f"),))
        for block in child.blocks:
            reason = check_program(block)
            if reason is not None:
                raise ProposalError(f"the proposed block does not parse: {reason}")
        return child


def _message_text(message: dict) -> str:
    """The text of a chat-completion message: its ``content`` string, the text parts of a list
    of content parts, or "" when it has none (``null``); ``TypeError`` for anything else."""
    content = message["content"]
    if content is None:
        return ""
    if isinstance(content, list):
        texts = [part.get("text") for part in content
                 if isinstance(part, dict) and part.get("type") == "text"]
        if all(isinstance(t, str) for t in texts):
            return "".join(texts)
    if not isinstance(content, str):
        raise TypeError(f"message content is {content!r:.80}; expected text")
    return content


class EnsembleProposer:
    """Samples one of several proposers per proposal with probabilities ∝ ``weights``."""

    name = "ensemble"

    def __init__(self, proposers: list, weights: list[float], *, seed: int = 0) -> None:
        if len(proposers) != len(weights) or not proposers:
            raise ValueError(f"{len(proposers)} proposers and {len(weights)} weights; expected "
                             "one weight per proposer and at least one proposer")
        w = np.asarray(weights, dtype=np.float64)
        if not np.isfinite(w).all() or np.any(w < 0) or w.sum() <= 0:  # NaN passed both tests
            raise ValueError(f"weights={weights!r}; expected finite non-negative weights with "
                             "a positive sum")
        self.proposers = proposers
        self.p = w / w.sum()
        self.rng = np.random.default_rng(check_seed(seed))

    def state(self) -> dict:
        return {"rng": self.rng.bit_generator.state,
                "members": [p.state() for p in self.proposers]}

    def load_state(self, state: dict) -> None:
        self.rng.bit_generator.state = state["rng"]
        for p, s in zip(self.proposers, state["members"], strict=True):
            p.load_state(s)

    def propose(self, parents: list[Program], prompt: str = "") -> tuple[Program, str]:
        member = self.proposers[int(self.rng.choice(len(self.proposers), p=self.p))]
        child, op = member.propose(parents, prompt)
        return child, f"{member.name}:{op}"
