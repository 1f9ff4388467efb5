"""Tools the assistant calls: ``[tools.NAME]`` config, the tools themselves, and the
runner that carries out each call at most once per turn.

Modules: ``spec`` (the config model), ``tool`` (a Python callable or a JSON POST, built
from the config), ``runner`` (validated arguments, once-only runs, cancellation).
Nothing here knows about models or providers: a tool call is a name, an id and JSON.
"""

from chainrun.tools.runner import (
    Confirmed,
    ToolCall,
    ToolCallRecord,
    ToolStatus,
    TurnTools,
    argument_problem,
)
from chainrun.tools.spec import RESERVED_ARGUMENTS, ToolConfig, check_tool_name
from chainrun.tools.tool import (
    FunctionTool,
    HttpTool,
    Tool,
    ToolContext,
    ToolFailed,
    build_tools,
    import_callable,
)

__all__ = [
    "RESERVED_ARGUMENTS",
    "Confirmed",
    "FunctionTool",
    "HttpTool",
    "Tool",
    "ToolCall",
    "ToolCallRecord",
    "ToolConfig",
    "ToolContext",
    "ToolFailed",
    "ToolStatus",
    "TurnTools",
    "argument_problem",
    "build_tools",
    "check_tool_name",
    "import_callable",
]
