"""What the provider tests share: scripted models for both frameworks (tool calls decided
by the test, no model service) and a loopback HTTP server a fenced command dials."""

from __future__ import annotations

import http.server
import itertools
import json
import threading
from typing import Any

_ids = itertools.count(1)


def target() -> tuple[int, list[str]]:
    """An HTTP server on 127.0.0.2 answering `ok`; (its port, the paths it was asked for).
    127.0.0.2, not 127.0.0.1: inside a container 127.0.0.1 is the container's own."""
    seen: list[str] = []

    class H(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            seen.append(self.path)
            self.send_response(200)
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"ok")

        def log_message(self, *a):
            pass

    srv = http.server.ThreadingHTTPServer(("127.0.0.2", 0), H)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv.server_address[1], seen


# -- the OpenAI Agents SDK: a `Model` that answers each turn from a script ----------------

def openai_scripted_model(turns: list[list[Any]]):
    """A `agents.Model` whose n-th response is `turns[n]` (output items, or a function of
    the tool outputs so far giving them), recording every tool output the framework sends
    back (`model.outputs[call_id]`)."""
    from agents import Model, ModelResponse, Usage

    class Scripted(Model):
        def __init__(self) -> None:
            self.turns = list(turns)
            self.outputs: dict[str, str] = {}

        async def get_response(self, system_instructions, input, model_settings, tools,
                               output_schema, handoffs, tracing, *, previous_response_id=None,
                               conversation_id=None, prompt=None, **kw):
            for item in input if isinstance(input, list) else []:
                if isinstance(item, dict) and item.get("type") in ("function_call_output",
                                                                  "custom_tool_call_output"):
                    out = item.get("output")
                    self.outputs[item["call_id"]] = out if isinstance(out, str) else json.dumps(out)
            if not self.turns:
                raise AssertionError("the script ran out of turns")
            turn = self.turns.pop(0)
            if callable(turn):
                turn = turn(self.outputs)
            return ModelResponse(output=turn, usage=Usage(), response_id=None)

        def stream_response(self, *a, **kw):
            raise NotImplementedError("the scripted model does not stream")

    return Scripted()


def oa_exec(cmd: str, call_id: str | None = None, **args: Any):
    """The SDK's `exec_command` tool call (`args`: its other arguments, e.g. tty)."""
    return _oa_call("exec_command", {"cmd": cmd, "yield_time_ms": 30000, **args}, call_id)


def oa_stdin(session_id: int, chars: str, call_id: str | None = None):
    """The SDK's `write_stdin` tool call (offered when the session supports a PTY)."""
    return _oa_call("write_stdin", {"session_id": session_id, "chars": chars,
                                    "yield_time_ms": 5000}, call_id)


def _oa_call(name: str, args: dict, call_id: str | None):
    from openai.types.responses import ResponseFunctionToolCall
    call_id = call_id or f"call_{next(_ids)}"
    return ResponseFunctionToolCall(type="function_call", name=name, call_id=call_id,
                                    arguments=json.dumps(args), id=f"fc_{call_id}",
                                    status="completed")


def oa_patch(patch: str, call_id: str | None = None):
    """The SDK's `apply_patch` tool call (a freeform custom tool)."""
    from openai.types.responses import ResponseCustomToolCall
    call_id = call_id or f"call_{next(_ids)}"
    return ResponseCustomToolCall(type="custom_tool_call", name="apply_patch", call_id=call_id,
                                  input=patch, id=f"ctc_{call_id}")


def oa_say(text: str):
    from openai.types.responses import ResponseOutputMessage, ResponseOutputText
    return ResponseOutputMessage(id=f"msg_{next(_ids)}", type="message", role="assistant",
                                 status="completed",
                                 content=[ResponseOutputText(type="output_text", text=text,
                                                             annotations=[])])


# -- deepagents (LangChain): a chat model that answers each turn from a script -------------

def langchain_scripted_model(turns: list[Any]):
    """A `BaseChatModel` whose n-th answer is `turns[n]`: a list of (tool name, args) calls,
    or a string (the final answer). Tool binding is accepted and ignored."""
    from langchain_core.language_models.chat_models import BaseChatModel
    from langchain_core.messages import AIMessage
    from langchain_core.outputs import ChatGeneration, ChatResult

    script = list(turns)

    class Scripted(BaseChatModel):
        @property
        def _llm_type(self) -> str:
            return "stockade-scripted"

        def bind_tools(self, tools, **kwargs):
            return self

        def _generate(self, messages, stop=None, run_manager=None, **kwargs):
            if not script:
                raise AssertionError("the script ran out of turns")
            turn = script.pop(0)
            if isinstance(turn, str):
                msg = AIMessage(content=turn)
            else:
                msg = AIMessage(content="", tool_calls=[
                    {"name": name, "args": args, "id": f"call_{next(_ids)}", "type": "tool_call"}
                    for name, args in turn])
            return ChatResult(generations=[ChatGeneration(message=msg)])

    return Scripted()
