"""System prompts for SILO-BENCH agents.

Two prompt sets:

* ``"code"`` (default): the content of the authors' ``generate_system_prompt(protocol, agent_id, N)`` (the
  authors' `src/utils/prompts.py` `generate_system_prompt`, jwyjohn/acl26-silo-bench), re-expressed:
  identity (agent i of N, IDs 0..N-1), collaborative mode, goals, the rule that *every* agent must submit,
  then the protocol's tool document (each tool with parameters, return shape and one example call) and the
  six rules.
* ``"paper"``: the layout of the paper's App. B.1 template (arXiv 2603.01045): the agent addressed by ID as
  one member of an N-agent system, then sections *Task Description*, *Your Local Data*, *Communication
  Protocol*, *Available Actions*, and the statement that no agent can finish alone. The task text and shard
  come from the case's user prompt, so here the system message carries the protocol/actions part and the
  user prompt is wrapped under the Task Description / Your Local Data headings.

The case's user prompt is always used verbatim as the agent's task text.
"""

from __future__ import annotations

from posttrain.utils.registry import Registry

PROMPT_SETS = ("code", "paper")

_FORMAT = """You MUST call tools with this XML format:

<tool_call>
  <tool>tool_name</tool>
  <parameters>
    <param1>value1</param1>
  </parameters>
</tool_call>
"""


def _tool(idx: int, name: str, desc: str, params: list[str], returns: str, example: dict[str, str]) -> str:
    plist = "\n".join(f"   - {p}" for p in params) if params else "   (none)"
    ex_params = "".join(f"\n       <{k}>{v}</{k}>" for k, v in example.items())
    return (
        f"{idx}. **{name}**: {desc}\n   Parameters:\n{plist}\n   Returns: {returns}\n"
        f"   Example:\n   <tool_call>\n     <tool>{name}</tool>\n     <parameters>{ex_params}\n"
        f"     </parameters>\n   </tool_call>\n"
    )


_WAIT = (
    "wait",
    "end your turn for this round and let the other agents act",
    [],
    '{"status": "waiting"}',
    {},
)
_SUBMIT = (
    "submit_result",
    "submit your final answer (you can do this only once)",
    ["answer (any): your final answer"],
    '{"status": "submitted"}',
    {"answer": "1000"},
)

_TOOLS = {
    "p2p": [
        (
            "send_message",
            "send a message to one other agent",
            ["target_id (int): ID of the receiving agent", "content (str): the message text"],
            '{"success": true/false, "message": "..."}',
            {"target_id": "2", "content": "My local maximum is 914"},
        ),
        (
            "receive_messages",
            "fetch every new message addressed to you",
            [],
            '{"messages": [{"from": int, "content": str, "timestamp": int}, ...]}',
            {},
        ),
        _WAIT,
        _SUBMIT,
    ],
    "bp": [
        (
            "broadcast_message",
            "send a message to ALL other agents",
            ["content (str): the message text"],
            '{"success": true/false, "message": "..."}',
            {"content": "My local maximum is 914"},
        ),
        (
            "receive_messages",
            "fetch every new broadcast from the other agents",
            [],
            '{"messages": [{"from": int, "content": str, "timestamp": int}, ...]}',
            {},
        ),
        (
            "list_agents",
            "list the IDs of all agents in the system",
            [],
            '{"agent_ids": [0, 1, 2, ...], "total": int}',
            {},
        ),
        _WAIT,
        _SUBMIT,
    ],
    "sfs": [
        (
            "list_files",
            "list the keys of the shared file system, optionally only those starting with a prefix",
            ["prefix (str, optional): only keys starting with this"],
            '{"files": [{"path": str, "modified_by": int, "modified_at_round": int}, ...]}',
            {"prefix": "agent_"},
        ),
        (
            "read_file",
            "read the value stored under a key",
            ["path (str): the key"],
            '{"success": true/false, "content": any, "metadata": {"modified_by": int, "modified_at_round": int}}',
            {"path": "agent_0_data"},
        ),
        (
            "write_file",
            "store a value under a key",
            ["path (str): the key", "content (any): the value"],
            '{"success": true/false, "message": "..."}',
            {"path": "agent_0_data", "content": "My local maximum is 914"},
        ),
        (
            "delete_file",
            "remove a key",
            ["path (str): the key"],
            '{"success": true/false, "message": "..."}',
            {"path": "temp_data"},
        ),
        _WAIT,
        _SUBMIT,
    ],
}

_VISIBILITY = {
    "p2p": "Messages you send this round reach the other agents NEXT round.",
    "bp": "Broadcasts you send this round reach the other agents NEXT round.",
    "sfs": "Files written this round become readable NEXT round; read_file and list_files show the "
    "state as of the PREVIOUS round.",
}

_COMM = {
    "p2p": "Point-to-point messaging: you can send a private message to any single agent and read the "
    "messages addressed to you.",
    "bp": "Broadcast: every message you send is delivered to all other agents; you read all broadcasts.",
    "sfs": "Shared file system: all agents read and write one shared key-value store.",
}


def tools_doc(protocol: str) -> str:
    """The protocol's tool document: format, tools (params, return shape, example) and the rules."""
    tools = _TOOLS[protocol]
    body = "".join(_tool(i + 1, *t) for i, t in enumerate(tools))
    comm_tools = ", ".join(t[0] for t in tools if t[0] not in ("wait", "submit_result"))
    rules = [
        _VISIBILITY[protocol],
        "wait and submit_result END YOUR TURN at once: later tool calls in the same reply are not "
        f"executed, so put {comm_tools} before them.",
        "After you submit you cannot do anything else.",
        "ALL agents must submit their final answer.",
        "Never invent tool results: the system returns them after your tool calls.",
        "You may make several tool calls in one reply.",
    ]
    rules_text = "\n".join(f"- {r}" for r in rules)
    return f"## Available Tools\n\n{_FORMAT}\n### Tools\n\n{body}\n**RULES:**\n{rules_text}\n"


prompt_sets: Registry = Registry("SILO prompt set")


@prompt_sets.register("code")
def code_system_prompt(protocol: str, agent_id: int, num_agents: int) -> str:
    """The authors' `generate_system_prompt` (`src/utils/prompts.py`), re-expressed."""
    return (
        f"You are one member of a multi-agent system of {num_agents} agents.\n\n"
        f"**Your identity:**\n- Your agent ID is: {agent_id}\n"
        f"- Agents in the system: {num_agents} (IDs 0 to {num_agents - 1})\n\n"
        "**How you work:** the agents collaborate. You communicate with the other agents and submit "
        "your answer only through the tools below.\n\n"
        "**Your goals:**\n- Work out the structure of the task and its data dependencies\n"
        "- Choose an efficient communication strategy\n- Avoid redundant communication\n"
        "- Converge on the correct answer\n\n"
        "**IMPORTANT: every agent must submit the final answer.** Do not leave it to a 'leader': you "
        "yourself must call submit_result with the correct answer. Coordinate so that every agent holds "
        "the correct answer before submitting.\n\n" + tools_doc(protocol)
    )


@prompt_sets.register("paper")
def paper_system_prompt(protocol: str, agent_id: int, num_agents: int) -> str:
    """arXiv 2603.01045 App. B.1 layout: identity, Communication Protocol, Available Actions."""
    return (
        f"You are Agent {agent_id}, one of {num_agents} agents (your agent ID is: {agent_id}; IDs 0 to "
        f"{num_agents - 1}) working together on one task. Each agent holds only part of the input: no "
        "single agent has enough information to finish the task alone.\n\n"
        f"## Communication Protocol\n{_COMM[protocol]} {_VISIBILITY[protocol]}\n\n"
        "## Available Actions\n" + tools_doc(protocol) + "\nEvery agent, including you, must submit the "
        "final answer with submit_result."
    )


def system_prompt(protocol: str, agent_id: int, num_agents: int, prompt_set: str = "code") -> str:
    return prompt_sets.get(prompt_set)(protocol, agent_id, num_agents)


def user_prompt(case_user_prompt: str, prompt_set: str = "code") -> str:
    """The case's user prompt; the paper set puts it under the Task Description heading."""
    if prompt_set == "paper":
        return (
            "## Task Description and Your Local Data\n"
            f"{case_user_prompt}\n\nUse the available actions to coordinate with the other agents."
        )
    return case_user_prompt


CORRECTIVE_MESSAGE = (
    "No valid tool call was found in your reply. Every action must be a tool call in this form:\n"
    "<tool_call>\n  <tool>tool_name</tool>\n  <parameters>\n    <name>value</name>\n  </parameters>\n"
    "</tool_call>"
)


# ------------------------------------------------------------------- scaffolds (arXiv 2603.01045 App. H)
# The paper's App. H ablation (DeepSeek-V3.1 + P2P) gives no exact texts; these are our `[proposed]`
# implementations.
SCAFFOLDS = ("planning", "reminder", "scratchpad")

PLANNING_NOTE = (
    "[Planning round] This first round is for planning: agree with the other agents on a communication "
    "plan only. Do not exchange data this round."
)
SCRATCHPAD_NOTE = (
    "[Scratchpad] Keep a running note in your replies of the data you have received so far and of the "
    "peers you are still waiting for."
)


def reminder_note(protocol: str) -> str:
    """A condensed copy of the system prompt's rules, injected at the start of every round (scaffold b)."""
    return (
        f"[Reminder] {_VISIBILITY[protocol]} wait and submit_result end your turn, so place other tool "
        "calls before them. Nothing can be done after submitting. Every agent must submit. Never invent "
        "tool results."
    )
